"""S3 test servers in processes of their own, for benchmarks of the S3 client side.

In the benchmark's own process a server answers under the same GIL as the code measured,
so its request handling is charged to the driver. Here each runs apart; `cpu_seconds`
says how much of a figure is the server's own work. The parent seeds objects straight
into the server's store (creating 100k objects over HTTP would take longer than what is
measured) and reads how many requests of each method it answered.

  * `MotoProcess`: moto's S3 app alone (without the dispatcher that matches every request
    against all AWS services, which doubles moto's time per request), the server the
    tests use. Its CPU per GET and its listing, which walks the whole bucket for every
    page, set the figure at 100k objects, not the client (bench/RESULTS.md).
  * `S3rverProcess`: s3rver (Node.js, objects as files in a directory; `bench/s3rver`,
    installed with `npm ci` on first use). Its listing stats every entry of a directory
    up to the page it returns, so it too grows with the square of one prefix's keys.

    with S3rverProcess() as server:  # or MotoProcess()
        server.seed_keys("bucket", [f"in/f{i:06d}.parquet" for i in range(100_000)], data)
        server.requests()  # {"GET": ..., "HEAD": ..., "PUT": ...} since the last call
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
S3RVER = REPO_ROOT / "bench" / "s3rver"

MOTO_SERVER = r"""
import base64, collections, json, logging, re, sys, threading
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import make_server
from tests.jobs.test_s3 import _fix_complete_multipart

counts = collections.Counter()
lock = threading.Lock()

class Count(logging.Handler):
    def emit(self, record):
        method = re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) ', record.getMessage())  # werkzeug may color it
        if method:
            with lock:
                counts[method.group(1)] += 1

werkzeug = logging.getLogger("werkzeug")
werkzeug.setLevel(logging.INFO)
werkzeug.propagate = False
werkzeug.addHandler(Count())
server = make_server("127.0.0.1", 0, _fix_complete_multipart(create_backend_app("s3")), threaded=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(json.dumps({"endpoint": f"http://127.0.0.1:{server.server_port}"}), flush=True)
backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
for line in sys.stdin:
    command = json.loads(line)
    if command["do"] == "seed":
        if command["bucket"] not in backend.buckets:
            backend.create_bucket(command["bucket"], "us-east-1")
        data = base64.b64decode(command["data"])
        for key in command["keys"]:
            backend.put_object(command["bucket"], key, data)
        answer = {}
    else:
        with lock:
            answer = dict(counts)
            counts.clear()
    print(json.dumps(answer), flush=True)
server.shutdown()
"""


class S3ServerProcess:
    """A server that prints `{"endpoint": ...}` on its first line, then answers one JSON
    command per stdin line (`seed`, `count`) with one JSON line."""

    name = ""
    access_key = secret_key = "x"

    def _command(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self):
        self.process = subprocess.Popen(self._command(), cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.endpoint = json.loads(self.process.stdout.readline())["endpoint"]
        return self

    def _ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def seed_keys(self, bucket: str, keys: list[str], data: bytes) -> None:
        """Objects at `keys`, each holding `data` (an empty list: the bucket alone)."""
        self._ask({"do": "seed", "bucket": bucket, "keys": keys, "data": base64.b64encode(data).decode()})

    def requests(self) -> dict[str, int]:
        """Requests answered by method since the last call."""
        return self._ask({"do": "count"})

    def cpu_seconds(self) -> float:
        """CPU time the server process has used (user + system)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def options(self) -> dict:
        """storage_options for pyarrow's S3 client against this server."""
        return {"endpoint_override": self.endpoint, "scheme": "http", "access_key": self.access_key,
                "secret_key": self.secret_key, "region": "us-east-1"}

    def __exit__(self, *exc) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


class MotoProcess(S3ServerProcess):
    name = "moto"

    def _command(self) -> list[str]:
        return [sys.executable, "-c", MOTO_SERVER]


class S3rverProcess(S3ServerProcess):
    """s3rver over a temporary directory, removed on exit. Node.js runs it with OpenSSL's
    legacy provider: s3rver encrypts its continuation tokens with DES, which OpenSSL 3
    refuses otherwise (every second page of a listing would fail)."""

    name = "s3rver"
    access_key = secret_key = "S3RVER"  # the one key pair s3rver accepts

    def __enter__(self):
        # s3rver stores an aws-chunked body (the SDK's default with a trailing checksum)
        # verbatim, framing and all; a plain body is what it can read back.
        os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
        if not (S3RVER / "node_modules" / "s3rver").is_dir():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=S3RVER, check=True)
        self.directory = tempfile.mkdtemp(prefix="bench-s3rver-")
        return super().__enter__()

    def _command(self) -> list[str]:
        return ["node", "--openssl-legacy-provider", str(S3RVER / "server.js"), self.directory]

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        shutil.rmtree(self.directory, ignore_errors=True)


SERVERS: dict[str, type[S3ServerProcess]] = {server.name: server for server in (S3rverProcess, MotoProcess)}
