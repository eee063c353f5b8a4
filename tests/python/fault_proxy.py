"""A fault-injecting HTTP/1.1 reverse proxy for DynamoDB's JSON API, stdlib only.

It sits between shardgate (`--dynamodb-endpoint http://127.0.0.1:<proxy port>`) and
DynamoDB Local and does, per request, whatever its current fault says; the fault can be
switched at run time through a small control port, and applies from the next request on,
also on connections kept alive from before:

- `pass`: forward the request unchanged and relay the answer (connections are kept alive
  both ways, as the AWS SDK expects);
- `delay` (`ms=N`): wait N ms, then forward. If the client gives up meanwhile (closes its
  connection: the SDK's deadline), the request is dropped, never forwarded, so a call the
  server saw fail cannot be applied behind its back;
- `http500`: `500` with DynamoDB's `InternalServerError` body;
- `ptee`: `400` `ProvisionedThroughputExceededException`;
- `throttle`: `400` `ThrottlingException` (the `com.amazon.coral.availability` namespace
  DynamoDB's control plane uses);
- `reset`: read the request, then close the connection with SO_LINGER 0 (a TCP RST);
- `conflict`: `400` `TransactionConflictException` to single-item writes (`UpdateItem`,
  `PutItem`), as DynamoDB answers one that meets a transaction in progress on its item;
  reads and transactions are forwarded.

A fault may be narrowed: `key=S` applies it only to requests whose body holds the text S
(a bucket's partition key, or part of it: one hot bucket), `op=O` only to requests of
operation O (`UpdateItem`, …), `min_debit=N` only to debits whose first limit's amount (in
millitokens) is at least N (a token lease's fetch takes a block, a request its hits),
`times=N` only to the next N requests it applies to; every other request is forwarded. `reason=R` adds DynamoDB's throttling reason R (e.g.
`TableWriteKeyRangeThroughputExceeded`: one partition key's limit;
`TableWriteAccountLimitExceeded`: the table's) to `ptee` and `throttle` answers.

Errors are sent as DynamoDB sends them: `Content-Type: application/x-amz-json-1.0`, a
JSON body with `__type` (namespace `#` code) and `message`, `x-amzn-RequestId` and
`x-amz-crc32`. The AWS Rust SDK reads the code after the `#`; it retries 500s (transient
status) with backoff, within the attempts and deadline the client is configured with;
connection resets are I/O errors, also retried. Both throttling codes are in its list of
retryable ones too, but shardgate's client forbids those retries (a throttle is answered
by the engine, at once).

If the upstream refuses the connection or fails mid-answer (DynamoDB Local stopped or
killed), the client's connection is reset the same way, so the client sees what it would
see talking to the store directly.

Run: `python fault_proxy.py --upstream 127.0.0.1:8000`; it binds two free loopback ports
and prints `LISTEN <proxy port> CONTROL <control port>` on its first stdout line.
Control (HTTP GET on the control port, JSON answers):
`/mode?fault=pass|delay|http500|ptee|throttle|reset|conflict[&ms=N][&key=S][&op=O][&min_debit=N][&times=N][&reason=R]`
sets the fault and returns the counters; `/stats` returns them.

`FaultProxy` below starts it as a subprocess for tests.
"""
import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
import zlib

FAULTS = ("pass", "delay", "http500", "ptee", "throttle", "reset", "conflict")

ERRORS = {
    "http500": (500, "Internal Server Error",
                "com.amazonaws.dynamodb.v20120810#InternalServerError",
                "Internal server error"),
    "ptee": (400, "Bad Request",
             "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
             "The level of configured provisioned throughput for the table was exceeded. "
             "Consider increasing your provisioning level with the UpdateTable API."),
    "throttle": (400, "Bad Request",
                 "com.amazon.coral.availability#ThrottlingException",
                 "Rate of requests exceeds the allowed throughput."),
    "conflict": (400, "Bad Request",
                 "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
                 "Transaction is ongoing for the item"),
}

def first_debit(body):
    """The millitokens an `UpdateItem` body's first debit takes (`ADD #t0 :n0`, or
    `SET #t0 = if_not_exists(#t0, :st0) + :n0` where the debit may create its item; `:n0`
    negative: shardgate's debit); 0 for anything else (a credit adds `:a0` to `#t0`, a
    read, a transaction, a body that is not JSON)."""
    try:
        request = json.loads(body)
        update = request["UpdateExpression"]
        if "#t0 :n0" not in update and "if_not_exists(#t0, :st0) + :n0" not in update:
            return 0
        return -int(request["ExpressionAttributeValues"][":n0"]["N"])
    except (ValueError, KeyError, TypeError):
        return 0


# The operations `conflict` answers (the others are forwarded).
SINGLE_ITEM_WRITES = ("UpdateItem", "PutItem")

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


class Gone(Exception):
    """The peer closed its connection (or sent something unusable)."""


class Buffered:
    """A stream reader with our own buffer, so a read can race other work and be
    cancelled without losing bytes."""

    def __init__(self, reader):
        self.reader = reader
        self.buf = bytearray()
        self.eof = False

    async def fill(self):
        """Reads what is there; False at EOF."""
        if self.eof:
            return False
        try:
            data = await self.reader.read(65536)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def head(self):
        """The bytes of a message head (start line and headers, through the blank line);
        None on a clean EOF before any byte."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                out = bytes(self.buf[:end + 4])
                del self.buf[:end + 4]
                return out
            if len(self.buf) > MAX_HEAD:
                raise Gone("head too large")
            if not await self.fill():
                if self.buf:
                    raise Gone("EOF inside a message head")
                return None

    async def exactly(self, n):
        while len(self.buf) < n:
            if not await self.fill():
                raise Gone("EOF inside a message body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def line(self):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                out = bytes(self.buf[:end + 2])
                del self.buf[:end + 2]
                return out
            if len(self.buf) > MAX_HEAD:
                raise Gone("line too long")
            if not await self.fill():
                raise Gone("EOF inside a chunk")


def parse_head(head):
    """(start line, {lower-case name: value}) of a message head."""
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


async def read_body(stream, headers, no_body=False):
    """The raw bytes of a body as framed on the wire (chunked kept chunked)."""
    if no_body:
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size_line = await stream.line()
            out += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers, up to the blank line.
                while True:
                    t = await stream.line()
                    out += t
                    if t == b"\r\n":
                        return bytes(out)
            out += await stream.exactly(size + 2)
            if len(out) > MAX_BODY:
                raise Gone("body too large")
    n = int(headers.get("content-length", "0") or "0")
    if n > MAX_BODY:
        raise Gone("body too large")
    return await stream.exactly(n)


def reset(writer):
    """Closes with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


def close(writer):
    if writer is not None:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - closing a dead socket
            pass


def error_response(kind, throttling_reason=None):
    status, reason, type_, message = ERRORS[kind]
    answer = {"__type": type_, "message": message}
    if throttling_reason and kind in ("ptee", "throttle"):
        # DynamoDB's model spells the field so in ThrottlingException, capitalised in
        # ProvisionedThroughputExceededException.
        field = "throttlingReasons" if kind == "throttle" else "ThrottlingReasons"
        answer[field] = [{
            "reason": throttling_reason,
            "resource": "arn:aws:dynamodb:us-east-1:000000000000:table/shardgate"}]
    body = json.dumps(answer).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"x-amzn-RequestId: {uuid.uuid4().hex.upper()}\r\n"
        f"x-amz-crc32: {zlib.crc32(body)}\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}\r\n"
        "\r\n"
    )
    return head.encode() + body


class Proxy:
    def __init__(self, upstream_host, upstream_port):
        self.upstream = (upstream_host, upstream_port)
        self.fault = "pass"
        self.delay_ms = 0
        # Narrowing of the fault (see the module's doc): None means any.
        self.key = None
        self.op = None
        self.min_debit = None
        self.times = None
        self.reason = None
        self.stats = {
            "connections": 0,
            "requests": 0,  # requests read from clients
            "forwarded": 0,  # requests sent upstream and answered
            "by_operation": {},  # forwarded requests by X-Amz-Target operation
            "faulted": {},  # requests answered by a fault, by fault
            "upstream_errors": 0,  # upstream refused or broke: the client was reset
            "client_gone": 0,  # the client left while its request was delayed or upstream
        }

    def count(self, field, key=None):
        if key is None:
            self.stats[field] += 1
        else:
            self.stats[field][key] = self.stats[field].get(key, 0) + 1

    def snapshot(self):
        return {"fault": self.fault, "delay_ms": self.delay_ms, "key": self.key,
                "op": self.op, "min_debit": self.min_debit, "times": self.times, "reason": self.reason,
                **json.loads(json.dumps(self.stats))}

    def applies(self, op, body):
        """Whether the current fault applies to this request (and counts it if narrowed
        to a number of times)."""
        if self.key is not None and self.key.encode() not in body:
            return False
        if self.op is not None and op != self.op:
            return False
        if self.min_debit is not None and first_debit(body) < self.min_debit:
            return False
        if self.times is not None:
            if self.times <= 0:
                return False
            self.times -= 1
        return True

    async def guarded(self, client, work):
        """Runs `work` while watching the client: if it closes its connection first,
        `work` is cancelled and Gone raised."""
        task = asyncio.ensure_future(work)
        while True:
            watch = asyncio.ensure_future(client.fill())
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                if not watch.done():
                    watch.cancel()
                    try:
                        await watch
                    except asyncio.CancelledError:
                        pass
                return task.result()
            if client.eof:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass
                raise Gone("client left")
            # Bytes arrived early (pipelining): they stay buffered; keep waiting.

    async def handle(self, reader, writer):
        self.count("connections")
        client = Buffered(reader)
        up = None  # (Buffered, writer) of this client's upstream connection
        try:
            while True:
                head = await client.head()
                if head is None:
                    return
                _, headers = parse_head(head)
                body = await read_body(client, headers)
                self.count("requests")
                op = headers.get("x-amz-target", "?").rpartition(".")[2]
                fault, delay_ms = self.fault, self.delay_ms
                if fault == "conflict" and op not in SINGLE_ITEM_WRITES:
                    fault = "pass"
                if fault != "pass" and not self.applies(op, body):
                    fault = "pass"
                if fault == "reset":
                    self.count("faulted", "reset")
                    reset(writer)
                    return
                if fault in ERRORS:
                    self.count("faulted", fault)
                    writer.write(error_response(fault, self.reason))
                    await writer.drain()
                    continue
                if fault == "delay":
                    self.count("faulted", "delay")
                    try:
                        await self.guarded(client, asyncio.sleep(delay_ms / 1000))
                    except Gone:
                        self.count("client_gone")
                        return
                try:
                    up, response, keep = await self.guarded(
                        client, self.forward(up, head + body))
                except Gone:
                    self.count("client_gone")
                    return
                except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    self.count("upstream_errors")
                    reset(writer)
                    return
                self.count("forwarded")
                self.count("by_operation", op)
                writer.write(response)
                await writer.drain()
                if not keep:
                    return
        except Gone:
            return
        except (ConnectionError, OSError):
            return
        finally:
            if up is not None:
                close(up[1])
            if not writer.transport.is_closing():
                close(writer)

    async def forward(self, up, request):
        """Sends one request upstream (reconnecting if needed) and reads the answer:
        (upstream connection or None, raw response, whether the client may keep its
        connection)."""
        if up is None or up[0].eof or up[1].transport.is_closing():
            if up is not None:
                close(up[1])
            r, w = await asyncio.open_connection(*self.upstream)
            up = (Buffered(r), w)
        stream, w = up
        try:
            w.write(request)
            await w.drain()
            head = await stream.head()
            if head is None:
                raise ConnectionError("upstream closed before answering")
            status_line, headers = parse_head(head)
            status = int(status_line.split(" ", 2)[1])
            no_body = status in (204, 304) or 100 <= status < 200
            body = await read_body(stream, headers, no_body=no_body)
        except Gone as e:
            close(w)
            raise ConnectionError(str(e)) from None
        except BaseException:
            close(w)
            raise
        keep = "close" not in headers.get("connection", "").lower()
        if not keep:
            close(w)
            up = None
        return up, head + body, keep

    async def control(self, reader, writer):
        """`GET /mode?fault=...&ms=...` or `GET /stats`; answers JSON."""
        try:
            head = await Buffered(reader).head()
            if head is None:
                return
            start, _ = parse_head(head)
            target = start.split(" ")[1] if len(start.split(" ")) > 1 else "/"
            url = urllib.parse.urlsplit(target)
            query = dict(urllib.parse.parse_qsl(url.query))
            status, answer = 200, None
            if url.path == "/mode":
                fault = query.get("fault", "")
                if fault not in FAULTS:
                    status, answer = 400, {"error": f"unknown fault {fault!r}; one of {FAULTS}"}
                else:
                    self.fault = fault
                    self.delay_ms = int(query.get("ms", "0"))
                    self.key = query.get("key")
                    self.op = query.get("op")
                    self.min_debit = int(query["min_debit"]) if "min_debit" in query else None
                    self.times = int(query["times"]) if "times" in query else None
                    self.reason = query.get("reason")
            elif url.path != "/stats":
                status, answer = 404, {"error": "GET /mode?fault=... or /stats"}
            body = json.dumps(answer or self.snapshot()).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (Gone, ConnectionError, OSError, ValueError):
            pass
        finally:
            close(writer)


async def serve(upstream, listen_port, control_port, ready):
    host, _, port = upstream.rpartition(":")
    proxy = Proxy(host, int(port))
    main = await asyncio.start_server(proxy.handle, "127.0.0.1", listen_port, backlog=256)
    ctl = await asyncio.start_server(proxy.control, "127.0.0.1", control_port)
    ready(main.sockets[0].getsockname()[1], ctl.sockets[0].getsockname()[1])
    async with main, ctl:
        await asyncio.gather(main.serve_forever(), ctl.serve_forever())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="host:port of DynamoDB (Local)")
    p.add_argument("--listen-port", type=int, default=0)
    p.add_argument("--control-port", type=int, default=0)
    p.add_argument("--exit-with-stdin", action="store_true",
                   help="exit when stdin reaches EOF (the parent process is gone)")
    a = p.parse_args()
    if not a.upstream.startswith("127.0.0.1:"):
        p.error("this proxy only forwards to 127.0.0.1")

    def ready(port, ctl):
        print(f"LISTEN {port} CONTROL {ctl}", flush=True)

    if a.exit_with_stdin:
        # The test process holds our stdin: if it dies without stopping us, we stop too.
        def watch_stdin():
            sys.stdin.buffer.read()
            os._exit(0)
        threading.Thread(target=watch_stdin, daemon=True).start()

    try:
        asyncio.run(serve(a.upstream, a.listen_port, a.control_port, ready))
    except KeyboardInterrupt:
        pass


# ----------------------------------------------------------------------------------------
# For tests: the proxy as a subprocess


class FaultProxy:
    """`fault_proxy.py` as a subprocess in front of `upstream_port` on 127.0.0.1."""

    START_TIMEOUT_S = 15.0

    def __init__(self, upstream_port, log_path):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--upstream", f"127.0.0.1:{upstream_port}",
             "--exit-with-stdin"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        )
        line = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(self.START_TIMEOUT_S)
        words = line[0].decode().split() if line else []
        if len(words) != 4 or words[0] != "LISTEN":
            self.stop()
            raise RuntimeError(f"fault proxy did not start: {line!r}, log:\n"
                               f"{open(log_path, errors='replace').read()}")
        self.port, self.control_port = int(words[1]), int(words[3])

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.control_port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def set(self, fault, ms=0, key=None, op=None, times=None, reason=None, min_debit=None):
        """Switches the fault (narrowed to `key`, `op`, `min_debit`, the next `times`
        requests, with a
        throttling `reason`: see the module's doc); returns the counters as they were at
        the switch."""
        assert fault in FAULTS, fault
        query = {"fault": fault, "ms": int(ms)}
        narrowing = (("key", key), ("op", op), ("times", times), ("reason", reason),
                     ("min_debit", min_debit))
        for name, value in narrowing:
            if value is not None:
                query[name] = value
        return self._get(f"/mode?{urllib.parse.urlencode(query)}")

    def stats(self):
        return self._get("/stats")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f:
                f.close()
        self._log.close()


if __name__ == "__main__":
    main()
