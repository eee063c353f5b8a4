#!/usr/bin/env python3
"""Writes src/server/rls_descriptor.bin: the FileDescriptorSet of Envoy's rate-limit API
(envoy/service/ratelimit/v3/rls.proto and every file it imports), served by gRPC
reflection. Built from the generated Python modules of the PyPI package xds-protos, so
it needs nothing but `pip install xds-protos`."""
import sys

from google.protobuf import descriptor_pb2
from envoy.service.ratelimit.v3 import rls_pb2


def main(out):
    seen, ordered = set(), []

    def visit(fd):
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            visit(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        ordered.append(proto)

    visit(rls_pb2.DESCRIPTOR)
    fds = descriptor_pb2.FileDescriptorSet(file=ordered)
    with open(out, "wb") as f:
        f.write(fds.SerializeToString(deterministic=True))
    print(f"{out}: {len(ordered)} files")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "src/server/rls_descriptor.bin")
