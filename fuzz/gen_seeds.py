#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into a directory (default fuzz/seeds/,
which is not committed): one sub-directory per target.

The committed corpora in fuzz/corpus/ were made from these seeds plus what fuzzing found,
minimized with `cargo fuzz cmin`; rerun this to start a corpus afresh. Requests are
encoded with the Envoy protos of the PyPI package xds-protos (an independent encoder,
not shardgate's); YAML seeds are the repository's rule files plus hand-written edge
cases; config maps are unpacked with PyYAML.

Usage: .venv/bin/python fuzz/gen_seeds.py [OUT_DIR]
"""

import hashlib
import re
import struct
import sys
from pathlib import Path

import yaml
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as rl
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import json_format

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "fuzz" / "seeds"

FILE_SEPARATOR = "\n# --- next file ---\n"  # as in fuzz_targets/config_yaml.rs


def write(target, data, name=None):
    if isinstance(data, str):
        data = data.encode("utf-8")
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    name = name or hashlib.sha1(data).hexdigest()
    (d / name).write_bytes(data)


# --- requests --------------------------------------------------------------------------


def desc(*entries, hits=None, limit=None):
    d = rl.RateLimitDescriptor()
    for k, v in entries:
        e = d.entries.add()
        e.key = k
        e.value = v
    if hits is not None:
        d.hits_addend.value = hits
    if limit is not None:
        d.limit.requests_per_unit, d.limit.unit = limit
    return d


def req(domain, *descriptors, hits_addend=0):
    r = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits_addend)
    r.descriptors.extend(descriptors)
    return r


def requests():
    edge = "edge"
    fz = "fuzz"
    yield req(edge, desc(("tenant", "acme")))
    yield req(edge, desc(("tenant", "acme"), ("api_key", "k1")), desc(("remote_address", "10.0.0.1")))
    yield req(edge, desc(("tenant", "acme"), ("model", "gpt-4o"), ("kind", "requests")))
    yield req(edge, desc(("tenant", "acme"), ("model", "gpt-4o"), ("kind", "tokens"), hits=0))
    yield req(edge, desc(("tenant", "acme"), ("model", "gpt-4o"), ("kind", "tokens"), hits=1234))
    yield req(
        edge,
        desc(("tenant", "acme"), ("model", "m"), ("kind", "requests")),
        desc(("tenant", "acme"), ("model", "m"), ("kind", "tokens"), hits=100001),
    )
    yield req(edge, desc(("path", "/api/v1/search?q=x")), desc(("path", "/admin/users")))
    yield req(edge, desc(("path", "/healthz")), desc(("path", "/admin/")))
    yield req(edge, desc(("remote_address", "::1")), hits_addend=41)
    yield req(fz, desc(("user", "u1")))
    yield req(fz, desc(("user", "u1"), ("key", "k")), desc(("user", "u1"), ("key", "k"), ("op", "get")))
    yield req(fz, desc(("shadow", "s")), desc(("user", "u")), hits_addend=3)
    yield req(fz, desc(("quota", "q")), desc(("quota2", "q")), desc(("user", "u")))
    yield req(fz, desc(("quota", "q"), hits=4), desc(("quota2", "q"), hits=2))
    yield req(fz, desc(("replacer", "r")), desc(("user", "u")), desc(("free_named", "f")))
    yield req(fz, desc(("free", "f")), desc(("free_named", "f")))
    yield req(fz, desc(("zero", "z")))
    yield req(fz, desc(("huge", "h"), hits=2**63))
    yield req(fz, desc(("huge", "h"), hits=2**64 - 1))
    yield req(fz, desc(("user", "u"), hits=(2**32 - 1) * 1000))
    yield req(fz, desc(("debt", "d"), hits=1000), desc(("debt", "d"), hits=0))
    yield req(fz, desc(("metric", "ünïcødé ✓ \"quoted\" {braces} \\back\nline")))
    yield req(fz, desc(("path", "/a/x")), desc(("path", "/a/")), desc(("path", "x.json")))
    yield req(fz, desc(("llm", "t1"), ("kind", "req")), desc(("llm", "t1"), ("kind", "tok"), hits=5000))
    yield req(fz, desc(("user", "u"), limit=(3, 1)), desc(("user", "u"), limit=(0, 7)))
    yield req(fz, desc(("x", "y"), limit=(2**32 - 1, 6)))
    yield req(fz, desc(("user", "u"), limit=(1, 0)))  # UNKNOWN unit: refused
    yield req(fz, desc(("user", "u"), limit=(1, 99)))
    yield req(fz, desc(("user", "")), desc(("user", "a=b/c%2F#0")))
    yield req(fz, desc(("", "v")))  # empty key: refused
    yield req(fz, desc())  # no entries: refused
    yield req(fz)  # no descriptors: refused
    yield req("", desc(("user", "u")))  # no domain: refused
    yield req("unknown-domain", desc(("user", "u")), desc(("a", "b")))
    yield req("ドメイン", desc(("キー", "値")))
    yield req(fz, *[desc(("user", f"u{i % 3}")) for i in range(64)])
    yield req(fz, *[desc(("user", "u")) for _ in range(65)])  # refused
    yield req(fz, desc(*[(f"k{i}", "v") for i in range(16)]))
    yield req(fz, desc(*[(f"k{i}", "v") for i in range(17)]))  # refused
    yield req(fz, desc(("k" * 256, "v")), desc(("user", "v" * 1024)))
    yield req(fz, desc(("k" * 257, "v")))  # refused
    yield req(fz, desc(("user", "v" * 1025)))  # refused
    yield req(fz, desc(("user", "u")), hits_addend=2**32 - 1)


def frame(payload, compressed=0):
    return struct.pack(">BI", compressed, len(payload)) + payload


def json_seeds(encoded):
    for r in encoded:
        write("http_json", json_format.MessageToJson(r, indent=None))
        write("http_json", json_format.MessageToJson(r, indent=None, preserving_proto_field_name=True))
    for body in [
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"u"}],"hitsAddend":"7"}]}',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"u"}],'
        '"limit":{"requestsPerUnit":"3","unit":"MINUTE"}}],"hitsAddend":2}',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"u"}],'
        '"limit":{"requests_per_unit":5,"unit":7}}]}',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user"}],"limit":{"unit":"fortnight"}}]}',
        '{"domain":null,"descriptors":null}',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":1,"value":[]}]}]}',
        '{"domain":"fuzz","descriptors":{}}',
        '{"domain":"fuzz","hitsAddend":-1,"descriptors":[]}',
        '{"domain":"fuzz","hitsAddend":4294967296,"descriptors":[]}',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"u"}],"hitsAddend":1e3}]}',
        '[]',
        '"just a string"',
        '{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"\\ud83d\\ude00\\u0000"}]}]}',
        '{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"},'
        '{"key":"model","value":"m"},{"key":"kind","value":"tokens"}],"hitsAddend":"18446744073709551615"}]}',
        '',
        '{',
    ]:
        write("http_json", body)


def request_seeds():
    encoded = list(requests())
    for r in encoded:
        data = r.SerializeToString()
        write("rls_request", data)
        write("grpc_body", frame(data))
    # A string field that is not UTF-8 (domain = b"\xff\xfe"): undecodable.
    d = desc(("user", "u")).SerializeToString()
    bad_utf8 = b"\x0a\x02\xff\xfe" + b"\x12" + bytes([len(d)]) + d
    write("rls_request", bad_utf8)
    write("grpc_body", frame(bad_utf8))
    one = req("fuzz", desc(("user", "u"))).SerializeToString()
    write("grpc_body", frame(one, compressed=1))  # compressed flag, no compression set up
    write("grpc_body", frame(one) + frame(one))  # two messages for a unary call
    write("grpc_body", frame(one)[:-2])  # truncated
    write("grpc_body", b"")
    write("grpc_body", struct.pack(">BI", 0, 2**31) + one)  # length beyond the body
    json_seeds(encoded)


# --- YAML ------------------------------------------------------------------------------

EDGE_YAML = [
    # Syntax and structure.
    "",
    "---\n",
    "domain: d\n---\ndomain: e\n",
    "domain: [unclosed\n",
    "\ufeffdomain: bom\ndescriptors: []\n",
    "domain: d\r\ndescriptors:\r\n  - key: k\r\n    rate_limit: {unit: second, requests_per_unit: 1}\r\n",
    "domain: d\ndescriptors:\n\t- key: k\n",
    "domain: d\ndomain: e\n",
    "- just\n- a\n- list\n",
    "!!binary aGVsbG8=\n",
    "domain: !!str 5\ndescriptors: !!seq []\n",
    "domain: &a d\ndescriptors:\n  - &k {key: *a, rate_limit: {unit: second, requests_per_unit: 1}}\n  - *k\n",
    "a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n",
    "domain: d\ndescriptors:\n" + "  " * 0 + "".join("  " * i + "- key: k\n" + "  " * i + "  descriptors:\n" for i in range(1, 20)),
    "[" * 200 + "]" * 200 + "\n",
    "{a: " * 100 + "1" + "}" * 100 + "\n",
    "? [complex, key]\n: value\n",
    "domain: d\ndescriptors:\n  - key: k\n    value: 200\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    # Numbers and ranges.
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0x10, burst: 0o7}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967295, burst: 18446744073709551615}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 18446744073709551616}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: SECOND, requests_per_unit: .inf}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    # Flags, names, replaces.
    "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n    quota_mode: 1\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: false}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}, {}, 3]}\n",
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: 'bad name#/'}\n",
    # Wildcards, share_threshold, entities, resources, cascade.
    "domain: d\ndescriptors:\n  - key: k\n    value: '*'\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    value: 'a**b*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    entity: '{k}/{k}/{{literal}}'\n    resource: r\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    entity: '{nope}{'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: k\n    entity: '}{'\n    resource: 'a#b'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n    descriptors:\n"
    "      - key: b\n        cascade: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        cascade: true\n"
    "        rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 9}\n    descriptors:\n"
    "      - key: b\n        cascade: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n"
    "        descriptors:\n          - key: c\n            cascade: true\n"
    "            rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: d\ndescriptors:\n  - key: a\n    entity: 'e'\n    rate_limit: {unit: second, requests_per_unit: 1, name: n}\n"
    "  - key: b\n    entity: 'e'\n    rate_limit: {unit: minute, requests_per_unit: 1, name: n}\n",
    "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
    "  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    "domain: d\nfailure_mode: ALLOW\ndescriptors:\n  - key: k\n    failure_mode: maybe\n    metadata: [1]\n",
    "domain: d\ndescriptors:\n  - key: ''\n    value: ''\n    metadata: {a: {b: [1, 2.5, null, true]}}\n"
    "    rate_limit: {unit: second, requests_per_unit: 1}\n",
    "domain: 'ドメイン'\ndescriptors:\n  - key: 'キー'\n    value: '値*'\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
    # Several files: a duplicate domain across them.
    "domain: d\ndescriptors: []\n" + FILE_SEPARATOR + "domain: d\ndescriptors: []\n",
    "domain: a\n" + FILE_SEPARATOR + "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
]


def rust_string_literals(text):
    """YAML-looking string literals of the Rust config tests (plain and raw)."""
    for m in re.finditer(r'r#"(.*?)"#', text, re.S):
        yield m.group(1)
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', text):
        s = m.group(1)
        s = re.sub(r"\\\n\s*", "", s)
        yield (
            s.replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace('\\"', '"')
            .replace("\\\\", "\\")
        )


def yaml_seeds():
    files = [ROOT / "config" / "example.yaml", ROOT / "fuzz" / "fuzz_targets" / "common" / "rules.yaml"]
    files += sorted((ROOT / "tests" / "envoy").glob("limits*/*.yaml"))
    files += sorted((ROOT / "envoy-examples").glob("**/shardgate*.yaml"))
    for f in files:
        write("config_yaml", f.read_text())
    # Rule files inside Kubernetes config maps.
    for f in sorted((ROOT / "envoy-examples").glob("**/configmap.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            for name, text in ((doc or {}).get("data") or {}).items():
                if name.endswith((".yaml", ".yml")) and "domain:" in text:
                    write("config_yaml", text)
    for f in sorted((ROOT / "tests").glob("config_*.rs")):
        for s in rust_string_literals(f.read_text()):
            if "domain:" in s and len(s) < 8192:
                write("config_yaml", s)
    for s in EDGE_YAML:
        write("config_yaml", s)


if __name__ == "__main__":
    request_seeds()
    yaml_seeds()
    for d in sorted(OUT.iterdir()):
        print(f"{d}: {sum(1 for _ in d.iterdir())} seeds")
