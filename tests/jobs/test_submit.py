"""A real `ray job submit` of `python -m jobs.embed` to a private Ray head.

The head runs on ports picked free on this host and in its own temp dir, so it never
meets another Ray on the machine; the test stops exactly the processes it started
(`ray stop` would stop every Ray on the host). Four jobs run at once, one CPU each: one
must end SUCCEEDED with complete output, and one of a tiny BGE-M3 with its dense, sparse and
multivector columns; one with a missing text column and one with a relative `--output`
FAILED with the driver's exit code 2, refused before they start.

Auth: token auth stays on, as it is by default in this Ray and on a real cluster. Ray
maps a loopback --node-ip-address to the host's routable address, so the GCS and raylet
listen beyond loopback even here, and the token is what guards them. The token is
generated per test cluster and handed over in RAY_AUTH_TOKEN, identically to the head
(and through it to the job's driver and workers) and to the `ray job` CLI; the default
token file ~/.ray/auth_token is neither read nor written.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from jobs.driver import REPO_ROOT, run_job
from jobs.spec import JobSpec
from tests.jobs.fixtures_models import free_ports, read_shard_table, save_tiny_bert, write_corpus
from tests.sparse_models import m3_reference, save_m3

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# Root-level hidden dirs (.git, caches, tool state) and outputs are not code: keep them
# out of the working_dir package, which is zipped and uploaded on every submission.
UPLOAD_EXCLUDES = ["/.*/", "/out/", "/build/", "__pycache__/"]
JOB_TIMEOUT_S = 240
_PORT_FLAGS = ("port", "ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port",
               "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port", "node-manager-port",
               "object-manager-port")


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: a forked child must not dlopen


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies, even by SIGKILL,
    so an aborted run cannot leave a Ray head behind (prctl PR_SET_PDEATHSIG = 1)."""
    _PRCTL(1, signal.SIGTERM)


class RayHead:
    """`ray start --head --block` on private ports and a private temp dir, token auth on.

    `--block` keeps `ray start` as the parent of every Ray process of this node (GCS,
    raylet, dashboard, agents, workers, job drivers), so teardown can find them all by
    process ancestry; SIGTERM to it drains the node and stops its children.
    """

    def __init__(self) -> None:
        # Short path: Ray's unix sockets live under it (limit ~107 bytes).
        self.temp_dir = tempfile.mkdtemp(prefix="pjray-", dir="/tmp")
        ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS))))
        self.address = f"http://127.0.0.1:{ports['dashboard-port']}"
        self.token = secrets.token_hex(32)
        # No inherited RAY_* (RAY_ADDRESS would point elsewhere); no PYTHONPATH, so the job
        # can import pooljobs only from its uploaded working_dir.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONPATH"}
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0"}
        self.cmd = [*RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                    "--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--num-cpus", "2",
                    "--object-store-memory", str(100 << 20), "--temp-dir", self.temp_dir, "--disable-usage-stats",
                    "--worker-port-list", ",".join(map(str, free_ports(16))),
                    *(f"--{flag}={port}" for flag, port in ports.items())]
        self.log_path = Path(self.temp_dir) / "ray-start.log"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def start(cls) -> RayHead:
        """A running head. A port picked free can be taken by another process before Ray
        binds it (`ray start` then exits): that is retried once, with fresh ports."""
        try:
            return cls()._launch()
        except RuntimeError:
            return cls()._launch()

    def _launch(self) -> RayHead:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.temp_dir, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self._wait_ready(timeout=90)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                self.api("/api/jobs/")  # the Jobs API answers, and accepts our token
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    log = self.log_path.read_text()[-4000:]
                    raise TimeoutError(f"Ray head not ready in {timeout}s:\n{log}") from None
                time.sleep(0.5)

    def api(self, path: str, token: str | None = None):
        """GET a dashboard REST path as JSON, with the cluster's token unless another is given."""
        auth = {"Authorization": f"Bearer {self.token if token is None else token}"}
        with urllib.request.urlopen(urllib.request.Request(self.address + path, headers=auth), timeout=10) as r:
            return json.loads(r.read())

    def ray(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([*RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        """Stop this head and every process it started, and remove its temp dir."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                head = psutil.Process(self.proc.pid)
                family = [head, *head.children(recursive=True)]
            except psutil.NoSuchProcess:
                family = []
            self.proc.send_signal(signal.SIGTERM)
            _, alive = psutil.wait_procs(family, timeout=30)
            for p in alive:  # only processes this head started
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.wait(timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class Submission:
    returncode: int  # of `ray job submit` (waiting): 0 when the job succeeded, else 1
    output: str  # the CLI's output, the tailed job logs included
    info: dict  # the Jobs API's record of the job (status, driver_exit_code, message, job_id)
    out_dir: Path


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead.start()
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("submit-model"))


@pytest.fixture(scope="module")
def m3_model(tmp_path_factory) -> Path:
    return save_m3(tmp_path_factory.mktemp("submit-m3") / "bge-m3")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("submit-corpus"))


@pytest.fixture(scope="module")
def submissions(ray_head, model, m3_model, corpus, tmp_path_factory) -> dict[str, Submission]:
    """Submit the jobs at once and wait for `ray job submit` to return for each."""
    root = tmp_path_factory.mktemp("submit-out")
    jobs = {"good": [], "bad": ["--text-column", "body"],  # the corpus has no column 'body'
            "relative": ["--output", "out/relative"],  # would land in Ray's temp copy of the working dir
            "m3": ["--model", str(m3_model), "--outputs", "dense,sparse,multivector"]}
    runtime_env = json.dumps({"excludes": UPLOAD_EXCLUDES})
    running = {}
    for name, extra in jobs.items():
        submission_id = f"pooljobs-{name}-{secrets.token_hex(4)}"
        cmd = [*RAY, "job", "submit", "--address", ray_head.address, "--submission-id", submission_id,
               "--working-dir", str(REPO_ROOT), "--runtime-env-json", runtime_env, "--",
               "python", "-m", "jobs.embed", "--input", str(corpus), "--output", str(root / name),
               "--model", str(model), "--device", "cpu", "--id-column", "id", "--unit-rows", "40", *extra]
        running[name] = (submission_id, subprocess.Popen(cmd, env=ray_head.env, stdout=subprocess.PIPE,
                                                         stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + JOB_TIMEOUT_S
    results = {}
    try:
        for name, (submission_id, proc) in running.items():
            try:
                output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ray_head.ray("job", "stop", "--address", ray_head.address, submission_id, timeout=60)
                proc.kill()
                output, _ = proc.communicate()
                pytest.fail(f"job {name} did not finish in {JOB_TIMEOUT_S}s:\n{output[-4000:]}")
            results[name] = Submission(proc.returncode, output, ray_head.api(f"/api/jobs/{submission_id}"), root / name)
    finally:
        for _, proc in running.values():  # after a failure above: no CLI left tailing a job
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def embeddings(table) -> np.ndarray:
    return np.stack(table["embedding"].to_numpy(zero_copy_only=False))  # (N, D)


def test_submitted_job_succeeds_with_complete_output(submissions, ray_head, model, corpus, tmp_path):
    job = submissions["good"]
    assert job.returncode == 0, job.output[-4000:]
    assert (job.info["status"], job.info["driver_exit_code"]) == ("SUCCEEDED", 0), job.info

    out = job.out_dir
    shards = sorted(p.name for p in out.glob("data/part-*.parquet"))
    assert shards == [f"part-0000{f}-0000{u}.parquet" for f in (0, 1) for u in (0, 1)]
    assert (out / "_SUCCESS").is_file()
    assert sorted(p.name for p in (out / "_manifest").iterdir()) == [s.replace(".parquet", ".json") for s in shards]
    report = json.loads((out / "_report.json").read_text())
    assert (report["units"], report["units_committed"], report["units_failed"], report["rows"]) == (4, 4, [], 120)
    ids = [i for s in shards for i in pq.read_table(out / "data" / s, columns=["id"])["id"].to_pylist()]
    assert sorted(ids) == list(range(120))  # every row once

    # The work ran in the submitted cluster: the driver connected to it (RAY_ADDRESS from
    # the job) rather than starting a Ray of its own, so its actor is in this head's state.
    actors = ray_head.api("/api/v0/actors?limit=1000")["data"]["result"]["result"]
    assert any(a["class_name"] == "WorkerActor" and a["job_id"] == job.info["job_id"] for a in actors), actors

    # Same embeddings as the in-process reference (the actor's thread count may differ,
    # hence a float tolerance rather than bitwise equality).
    reference = tmp_path / "local"
    spec = JobSpec(input=str(corpus), output=str(reference), model=str(model), backend="local", device="cpu",
                   id_column="id", unit_rows=40, progress=False)
    assert run_job(spec).ok
    local = pafs.LocalFileSystem()
    got, want = read_shard_table(local, str(out)), read_shard_table(local, str(reference))
    assert got["id"].equals(want["id"])
    np.testing.assert_allclose(embeddings(got), embeddings(want), rtol=0, atol=1e-5)


def test_submitted_m3_job_writes_dense_sparse_and_multivector(submissions, m3_model, corpus):
    job = submissions["m3"]
    assert (job.info["status"], job.info["driver_exit_code"]) == ("SUCCEEDED", 0), job.output[-4000:]
    table = read_shard_table(pafs.LocalFileSystem(), str(job.out_dir))
    source = pq.read_table(corpus).to_pydict()
    text_of = dict(zip(source["id"], source["text"]))
    dense, lexical, colbert = m3_reference(m3_model, [text_of[i] for i in table["id"].to_pylist()])
    np.testing.assert_allclose(embeddings(table), dense, atol=1e-5)
    for indices, values, vectors, ref, ref_vectors in zip(
            table["sparse_indices"].to_pylist(), table["sparse_values"].to_pylist(), table["multivector"].to_pylist(),
            lexical, colbert):
        assert indices == sorted(ref)
        np.testing.assert_allclose(values, [ref[i] for i in indices], atol=1e-5)
        np.testing.assert_allclose(np.asarray(vectors), ref_vectors, atol=1e-5)


def test_submitted_job_with_a_missing_column_is_refused_before_it_starts(submissions):
    job = submissions["bad"]
    assert job.returncode != 0, job.output[-4000:]
    assert (job.info["status"], job.info["driver_exit_code"]) == ("FAILED", 2), job.info
    assert "jobs.embed: error: text_column='body': no input file has this column" in job.output
    assert "Traceback" not in job.output
    assert not job.out_dir.exists() or not any(job.out_dir.iterdir())  # nothing claimed: a corrected rerun just runs


def test_submitted_job_with_a_relative_output_is_refused(submissions):
    job = submissions["relative"]
    assert (job.info["status"], job.info["driver_exit_code"]) == ("FAILED", 2), job.info
    assert "jobs.embed: error: output='out/relative' is relative, and under `ray job submit`" in job.output
    assert "Traceback" not in job.output and not job.out_dir.exists()


def test_cluster_refuses_requests_without_the_token(ray_head):
    for token in ("", "not-the-token"):
        with pytest.raises(urllib.error.HTTPError) as e:
            ray_head.api("/api/jobs/", token=token)
        assert e.value.code in (401, 403)
