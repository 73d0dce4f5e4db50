"""moto's S3 server in a process of its own, for benchmarks of the S3 client side.

In the benchmark's own process moto answers under the same GIL as the code measured, so
its request handling is charged to the driver. Here it runs apart, as moto's S3 app
alone (without the dispatcher that matches every request against all AWS services,
which doubles moto's time per request); `cpu_seconds` says how much of a figure is the
server's own work. The parent seeds
objects straight into its backend (creating 100k objects over HTTP would take longer
than what is measured) and reads how many requests of each method it answered.

    with MotoProcess() as server:
        server.seed("bucket", "in/f{:06d}.parquet", 100_000, data)  # or seed_keys(bucket, keys, data)
        server.requests()  # {"GET": ..., "HEAD": ..., "PUT": ...} since the last call
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

SERVER = r"""
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


class MotoProcess:
    def __enter__(self) -> MotoProcess:
        self.process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.endpoint = json.loads(self.process.stdout.readline())["endpoint"]
        return self

    def _ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def seed(self, bucket: str, key: str, count: int, data: bytes) -> None:
        """Objects `key.format(i)` for i < count, each holding `data`."""
        self.seed_keys(bucket, [key.format(i) for i in range(count)], data)

    def seed_keys(self, bucket: str, keys: list[str], data: bytes) -> None:
        """Objects at `keys`, each holding `data`."""
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
        return {"endpoint_override": self.endpoint, "scheme": "http", "access_key": "x", "secret_key": "x",
                "region": "us-east-1"}

    def __exit__(self, *exc) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
