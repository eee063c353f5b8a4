"""A stand-in for DynamoDB on 127.0.0.1, for tests that need a store they control: slow
calls, failing calls, and a record of which buckets the server touched.

Just enough of DynamoDB's JSON protocol for shardgate to admit a request on a new bucket:
`UpdateItem` (the fast debit) fails its condition with no old item, so the bucket is
missing; `BatchGetItem` finds nothing; `PutItem` creates it. Each `UpdateItem` is
recorded under the call number found in its bucket's entity (`k=<n>`) and held for
`hold` seconds first (`release` ends every hold at once). With `failing` set, every call
is answered as a failing DynamoDB answers: HTTP 500, InternalServerError (the SDK retries
it within the store timeout, then the call fails as the store's fault).
"""
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeDynamo:
    """The stand-in; a context manager that serves while entered."""

    def __init__(self, hold=0.0):
        self.hold = hold
        self.failing = False
        self.release = threading.Event()  # set: stop holding at once
        self.lock = threading.Lock()
        self.seen = {}  # call ident -> time its UpdateItem arrived
        self.answered = {}  # call ident -> time its UpdateItem was answered
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", "fake")
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server exited (grace period over) while this was held

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                op = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
                if fake.failing:
                    self.reply(500, {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
                                     "message": "the stand-in is failing on purpose"})
                elif op == "UpdateItem":
                    m = re.search(r"#k=(\d+)#", body["Key"]["PK"]["S"])
                    ident = int(m.group(1)) if m else None
                    with fake.lock:
                        fake.seen[ident] = time.monotonic()
                    fake.release.wait(fake.hold)
                    self.reply(400, {
                        "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                        "message": "The conditional request failed"})
                    with fake.lock:
                        fake.answered[ident] = time.monotonic()
                elif op == "BatchGetItem":
                    self.reply(200, {"Responses": {t: [] for t in body.get("RequestItems", {})},
                                     "UnprocessedKeys": {}})
                elif op == "PutItem":
                    self.reply(200, {})
                else:
                    self.reply(400, {"__type": "com.amazon.coral.validate#ValidationException",
                                     "message": f"not faked: {op}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def seen_count(self):
        with self.lock:
            return len(self.seen)

    def serve_options(self, store_timeout="30s"):
        """`shardgate(...)` keywords for a server on this stand-in."""
        return {
            "store": "dynamodb",
            "args": ["--dynamodb-endpoint", self.endpoint, "--store-timeout", store_timeout],
            # Dummy credentials for a loopback stand-in; nothing is looked up elsewhere.
            "env": {"AWS_ACCESS_KEY_ID": "fake", "AWS_SECRET_ACCESS_KEY": "fake",
                    "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"},
        }
