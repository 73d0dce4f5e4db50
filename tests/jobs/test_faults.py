"""Faults do not change the output: a killed actor, a lost node and a killed driver all
end in exactly the uninterrupted run's shards; a unit that keeps failing is recorded as
failed (and named) while every other unit commits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

from jobs.cli import main
from jobs.driver import REPO_ROOT, run_job
from tests.jobs.conftest import committed_count
from workers.unit import UnitRunner


def test_killed_actors_change_nothing(ray_local, make_spec, same_as_reference, after_commits, find_worker_actors,
                                      tmp_path):
    """SIGKILL an actor in the middle of a unit after 2, 7 and 12 of 16 commits: Ray
    restarts it and reruns its units; the output is the uninterrupted run's."""

    def kill_running_actor():
        running = find_worker_actors(running=True)
        if not running:
            return None  # between units: ask again
        running[0].kill()
        return running[0].pid

    watcher = after_commits(tmp_path, [2, 7, 12], kill_running_actor)
    outcome = run_job(make_spec(tmp_path, backend="ray"))
    watcher.stop()
    assert not watcher.errors, watcher.errors
    assert len(watcher.done) == 3, f"the job ended before every kill: {watcher.done}"
    assert outcome.ok, outcome.failed
    same_as_reference(tmp_path)


def corrupt_row_group(src: Path, dst: Path, row_group: int) -> None:
    """Copy a Parquet file with one row group's `text` pages overwritten; the footer stays
    valid, so the file plans normally and only the unit reading that group fails."""
    shutil.copy(src, dst)
    column = pq.ParquetFile(dst).metadata.row_group(row_group).column(1)
    assert column.path_in_schema == "text"
    start = column.dictionary_page_offset or column.data_page_offset
    with open(dst, "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * column.total_compressed_size)


def test_corrupt_file_fails_its_unit_only(ray_local, text_corpus, tiny_bert, reference, tmp_path, capsys):
    """On Ray, a unit whose row group cannot be decoded fails without retries (a data
    error), the other 15 commit, and the CLI exits 1 naming the unit and the file."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    shutil.copy(text_corpus / "corpus-0.parquet", inputs)
    bad = inputs / "corpus-1.parquet"
    corrupt_row_group(text_corpus / "corpus-1.parquet", bad, row_group=5)  # unit 2 of file 1: row groups 4-5
    argv = ["--input", str(inputs), "--output", str(out), "--model", str(tiny_bert), "--id-column", "id",
            "--device", "cpu", "--unit-rows", "200", "--backend", "ray", "--num-workers", "1", "--no-progress"]

    assert main("jobs.embed", "", ("embed",), argv) == 1
    printed = capsys.readouterr()
    assert f"FAILED part-00001-00002 ({bad}): InputError: cannot read {bad}" in printed.out
    report = json.loads((out / "_report.json").read_text())
    assert [(f["unit"], f["file"]) for f in report["units_failed"]] == [("part-00001-00002", str(bad))]
    assert report["units_committed"] == 15
    assert not (out / "_SUCCESS").exists()
    for name, want in reference.items():
        shard = out / "data" / f"{name}.parquet"
        if name == "part-00001-00002":
            assert not (out / "_manifest" / f"{name}.json").exists()
        else:
            assert pq.read_table(shard, columns=["id"]).column("id").equals(want.column("id")), name


def test_unit_failing_every_attempt(single_thread, make_spec, same_as_reference, tmp_path, monkeypatch):
    """A unit that raises on every attempt is tried 1 + max_retries times and recorded
    as failed; the rest commit; a rerun once the fault is gone redoes only that unit."""
    flaky, calls, run = "part-00001-00003", Counter(), UnitRunner.run

    def run_or_fail(self, unit):
        calls[unit.name] += 1
        if unit.name == flaky:
            raise RuntimeError("device lost")
        return run(self, unit)

    monkeypatch.setattr(UnitRunner, "run", run_or_fail)
    spec = make_spec(tmp_path, backend="local", max_retries=2)
    outcome = run_job(spec)
    assert not outcome.ok
    assert outcome.failed == {flaky: "RuntimeError: device lost"}
    assert calls[flaky] == 3 and set(calls.values()) == {1, 3}
    report = json.loads((tmp_path / "_report.json").read_text())
    assert report["units_failed"] == [{"unit": flaky, "file": str(Path(spec.input) / "corpus-1.parquet"),
                                       "error": "RuntimeError: device lost"}]
    assert report["units_committed"] == 15 and not (tmp_path / "_SUCCESS").exists()

    monkeypatch.undo()
    outcome = run_job(spec)
    assert outcome.ok and outcome.report["units_run_now"] == 1
    same_as_reference(tmp_path)


def test_lost_node_changes_nothing(ray_cluster, ray_instances, make_spec, same_as_reference, after_commits,
                                   find_worker_actors, tmp_path):
    """Remove a worker node while its actor runs a unit: the actor restarts on the spare
    CPU of another node and the output is the uninterrupted run's."""
    cluster = ray_cluster

    def remove_busy_node():
        for node in list(cluster.worker_nodes):
            raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
            if find_worker_actors(raylet, running=True):
                cluster.remove_node(node, allow_graceful=False)
                return node.node_id
        return None

    try:
        watcher = after_commits(tmp_path, [4], remove_busy_node)
        outcome = run_job(make_spec(tmp_path, backend="ray", num_workers=2))
        watcher.stop()
        assert not watcher.errors, watcher.errors
        assert len(watcher.done) == 1, "the job ended before a node was removed"
        assert outcome.ok, outcome.failed
        same_as_reference(tmp_path)
    finally:
        ray_instances.close()  # the cluster is a node short now


def test_killed_driver_resumes(no_ray, single_thread, make_spec, reference, same_as_reference, count_commits, tmp_path,
                               capsys):
    """`python -m jobs.embed` on its own local Ray, SIGKILLed with its process group after
    a few commits; the same command then finishes the remaining units only, and the
    output is the uninterrupted run's. The same output with another option is refused
    (exit 2, naming the option) unless --overwrite."""
    spec = make_spec(tmp_path / "out")
    out = Path(spec.output)
    argv = ["--input", spec.input, "--output", spec.output, "--model", spec.model, "--id-column", "id",
            "--device", "cpu", "--unit-rows", str(spec.unit_rows), "--no-progress"]
    command = [sys.executable, "-m", "jobs.embed", *argv, "--backend", "ray", "--num-workers", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)

    kill_after_commits(command, env, out, 3, tmp_path / "killed.log")
    done_before = count_commits(out)
    assert not (out / "_SUCCESS").exists() and done_before < len(reference), "the driver finished before it was killed"

    rerun = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    same_as_reference(out)
    assert json.loads((out / "_report.json").read_text())["units_run_now"] == len(reference) - done_before

    job_file = (out / "_job.json").read_bytes()
    for flag, key in ((["--dim", "16"], "options.dim"), (["--normalize"], "options.normalize")):
        assert main("jobs.embed", "", ("embed",), [*argv, *flag, "--backend", "local"]) == 2
        error = capsys.readouterr().err
        assert "different settings" in error and f"differs in: {key})" in error, error
    assert (out / "_job.json").read_bytes() == job_file
    same_as_reference(out)

    assert main("jobs.embed", "", ("embed",), [*argv, "--dim", "16", "--overwrite", "--backend", "local"]) == 0
    assert json.loads((out / "_job.json").read_text())["options"]["dim"] == 16
    table = pq.read_table(out, columns=["id", "embedding"])
    assert table.schema.field("embedding").type.list_size == 16
    rows = sum(t.num_rows for t in reference.values())
    assert np.array_equal(np.sort(table.column("id").to_numpy()), np.arange(rows))


# The job, with every commit record after the first two stuck half written in its temp
# file: the driver goes on dispatching (records are stored off the dispatch thread) while
# the records queue up behind the stuck ones.
STUCK_COMMITS = """
import runpy, sys, threading
from jobs import manifest

real, stored = manifest.Manifest._put, []

def put(self, path, data):
    if "/_manifest/" not in path:
        return real(self, path, data)
    if len(stored) < 2:
        stored.append(path)
        return real(self, path, data)
    parent, name = path.rsplit("/", 1)
    with open(f"{parent}/.{name}.stuck.tmp", "wb") as half:
        half.write(data[: len(data) // 2])
    threading.Event().wait()

manifest.Manifest._put = put
sys.argv = ["jobs.embed", *sys.argv[1:]]
runpy.run_module("jobs.embed", run_name="__main__")
"""


def test_driver_killed_with_commit_records_in_flight(no_ray, single_thread, make_spec, reference, same_as_reference,
                                                     tmp_path):
    """SIGKILLed while shards are written whose commit records are queued or half stored:
    those units count as not done (a half-written record is a hidden temp file, never a
    record), the rerun redoes exactly them over their shard files, and the output is the
    uninterrupted run's."""
    spec = make_spec(tmp_path / "out")
    out = Path(spec.output)
    argv = ["--input", spec.input, "--output", spec.output, "--model", spec.model, "--id-column", "id",
            "--device", "cpu", "--unit-rows", str(spec.unit_rows), "--no-progress", "--backend", "local"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    with open(tmp_path / "stuck.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, "-c", STUCK_COMMITS, *argv], cwd=REPO_ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while len(list(Path(out, "data").glob("part-*.parquet"))) < 6 and driver.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            assert driver.poll() is None, (tmp_path / "stuck.log").read_text()[-3000:]
        finally:
            kill_process_tree(driver)
    shards = {p.stem for p in Path(out, "data").glob("part-*.parquet")}
    assert committed_count(out) == 2 and len(shards) >= 6 and list(Path(out, "_manifest").glob(".*.stuck.tmp"))

    rerun = subprocess.run([sys.executable, "-m", "jobs.embed", *argv], cwd=REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    same_as_reference(out)
    assert json.loads((out / "_report.json").read_text())["units_run_now"] == len(reference) - 2


def kill_after_commits(command: list[str], env: dict, out: Path, commits: int, log_path: Path) -> None:
    """Run `command` in a session of its own and SIGKILL it (`kill_process_tree`) once `out`
    holds `commits` commit records; fails if it ends first or commits nothing in 300 s."""
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while committed_count(out) < commits and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert driver.poll() is None, log_path.read_text()[-3000:]
            assert committed_count(out) >= commits, "no commits in 300 s"
        finally:
            kill_process_tree(driver)


def kill_process_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with `start_new_session=True`, its process group, and any
    descendant that left the group (Ray daemons and workers it started)."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(descendants, timeout=15)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=15)
