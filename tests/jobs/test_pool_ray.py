"""Ray workers: kept across notebook calls, placed with a bounded wait (what cannot be
placed is named; nothing hangs), and a local Ray that pooljobs starts leaves no process
behind when its driver is killed, and serves no metrics on every interface."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from jobs import pool as pools
from jobs.driver import REPO_ROOT, run_job


@pytest.fixture
def fast_placement(monkeypatch):
    monkeypatch.setattr(pools, "PLACEMENT_SECONDS", 20.0)
    monkeypatch.setattr(pools, "PROGRESS_SECONDS", 2.0)


def test_ray_actors_are_kept_across_calls(ray_local, make_spec, same_as_reference, tmp_path):
    try:
        first = run_job(make_spec(tmp_path / "a", backend="ray", num_workers=1), keep_workers=True)
        second = run_job(make_spec(tmp_path / "b", backend="ray", num_workers=1), keep_workers=True)
        assert first.ok and second.ok
        [w1], [w2] = first.report["workers"], second.report["workers"]
        assert w1["pid"] == w2["pid"] and w2["loads"] == 1, "the same actor, the model read once"
        assert second.report["startup"]["actors_placed"] == 0.0
        assert "model_load" in first.report["startup"] and "model_load" not in second.report["startup"]
        same_as_reference(tmp_path / "b")
    finally:
        pools.shutdown()


def test_unplaceable_workers_are_named_and_the_rest_work(ray_local, make_spec, same_as_reference, tmp_path,
                                                         fast_placement, capsys):
    """8 GPU workers on 2 (fake) GPUs: 2 are placed and do every unit; the 6 others are
    named (given up on at the timeout, or never placed when the job ends first)."""
    t = time.monotonic()
    outcome = run_job(make_spec(tmp_path, backend="ray", num_workers=8))
    assert outcome.ok and time.monotonic() - t < 150
    assert len({w["pid"] for w in outcome.report["workers"]}) == 2
    err = capsys.readouterr().err
    assert ("gave up on 6 of 8 workers" in err and "running on 2" in err
            or "6 of 8 workers were never placed" in err and "the job ran on 2" in err), err
    assert "each needs 1 GPU and 1 CPU; the cluster has 2 CPU, 2 GPU" in err
    same_as_reference(tmp_path)


def test_no_placeable_worker_is_a_placement_error(ray_local, make_spec, tmp_path, fast_placement):
    """Every CPU is held: no worker can be placed, the job stops with one clear error."""
    import ray

    @ray.remote(num_cpus=1)
    class Holder:
        def ping(self) -> int:
            return 1

    holders = [Holder.remote() for _ in range(2)]
    ray.get([h.ping.remote() for h in holders])
    try:
        with pytest.raises(pools.PlacementError, match=r"none of 1 workers could be placed within 20s"):
            run_job(make_spec(tmp_path, backend="ray", num_workers=1, device="cpu"))
    finally:
        for h in holders:
            ray.kill(h)


def test_cli_says_placement_error_in_one_line(monkeypatch):
    from jobs.cli import user_errors

    assert pools.PlacementError in user_errors()


STARTER = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from jobs.driver import init_ray
init_ray(None)
import ray
@ray.remote(num_cpus=1)
def f():
    return os.getpid()
print(json.dumps({{"worker": ray.get(f.remote())}}), flush=True)
time.sleep(600)
"""


def _listeners(pids: set[int]) -> list:
    return [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids]


def _serves_metrics(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return b"# TYPE" in r.read(200_000)
    except Exception:  # noqa: BLE001 - gRPC ports and closed ones answer no HTTP
        return False


def test_killed_driver_leaves_no_ray_process_and_no_metrics_on_all_interfaces(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    driver = subprocess.Popen([sys.executable, "-c", STARTER.format(root=str(REPO_ROOT))], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    try:
        line = driver.stdout.readline()
        assert line, "the driver started Ray and ran a task"
        assert json.loads(line)["worker"]
        time.sleep(3)  # the agents are up
        tree = {p.pid: p for p in psutil.Process(driver.pid).children(recursive=True)}
        ray_tree = {pid: p for pid, p in tree.items() if "jobs.reaper" not in " ".join(p.cmdline())}
        assert any("raylet" in p.name() for p in ray_tree.values())
        pids = set(ray_tree)
        wildcard = [c for c in _listeners(pids) if c.laddr.ip in ("0.0.0.0", "::")]
        assert not [c for c in wildcard if c.laddr.ip == "0.0.0.0"], wildcard
        assert not [c.laddr.port for c in wildcard if _serves_metrics(c.laddr.port)]
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        deadline = time.monotonic() + 30
        alive = []
        while time.monotonic() < deadline:
            alive = [p for p in ray_tree.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.5)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        if driver.poll() is None:
            driver.kill()


def test_cli_more_workers_than_cpus_does_not_hang(tiny_bert, text_corpus, tmp_path):
    """`--num-workers 8` on a local Ray of this machine's CPUs: the placeable workers run the
    job, the others are named, and the process ends (exit 0) within a bounded time."""
    cpus = psutil.cpu_count()
    if cpus >= 8:
        pytest.skip("this machine can place 8 CPU workers")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "POOLJOBS_PLACEMENT_SECONDS": "30"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "jobs.embed", "--input", str(text_corpus), "--output",
                           str(tmp_path / "out"), "--model", str(tiny_bert), "--device", "cpu", "--num-workers", "8",
                           "--unit-rows", "200", "--no-progress"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"(gave up on \d+ of 8 workers|\d+ of 8 workers were never placed)", done.stderr), done.stderr
    assert "Traceback" not in done.stderr
