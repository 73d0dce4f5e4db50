"""Planning and the manifest at scale: links followed once, names that sort in input
order, units linear in row groups, resume from one listing, and commits queued off the
dispatch thread that stay exactly-once when the driver is killed in the middle of them."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import jobs.plan
from jobs.driver import REPO_ROOT
from jobs.manifest import PLAN, Manifest
from jobs.plan import InputFile, _spans, list_inputs, plan_units, save_plan, saved_or_planned
from jobs.spec import JobSpec


def _write(path: Path, rows: int = 3, row_group_size: int | None = None) -> None:
    pq.write_table(pa.table({"id": list(range(rows)), "text": ["t"] * rows}), path, row_group_size=row_group_size)


def test_symlink_cycles_and_second_links_are_read_once(make_spec, tmp_path, caplog):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    _write(src / "sub" / "a.parquet")
    (src / "sub" / "loop").symlink_to(src, target_is_directory=True)
    (src / "again").symlink_to(src / "sub", target_is_directory=True)
    (src / "link.parquet").symlink_to(src / "sub" / "a.parquet")
    (src / "broken.parquet").symlink_to(src / "missing.parquet")
    with caplog.at_level(logging.WARNING, logger="pooljobs"):
        files = list_inputs(make_spec(tmp_path / "out", input=str(src)))
    # a directory's files come before its subdirectories, each in name order: the first name wins
    assert [f.uri for f in files] == [str(src / "link.parquet")]
    log = caplog.text
    assert f"skipped {src / 'again' / 'a.parquet'}: the same file as {src / 'link.parquet'}" in log
    assert f"skipped {src / 'again' / 'loop'}: the same directory as {src} (a symlink loop" in log
    assert f"skipped {src / 'sub'}: the same directory as {src / 'again'}" in log
    assert f"skipped {src / 'broken.parquet'}" in log


def test_unit_names_sort_in_input_order_past_the_name_width(make_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs.plan, "NAME_DIGITS", 1)
    for f in range(11):
        _write(tmp_path / f"f{f:02d}.parquet", rows=11, row_group_size=1)
    units = plan_units(make_spec(tmp_path / "out", input=str(tmp_path), unit_rows=1), list_inputs(
        make_spec(tmp_path / "out", input=str(tmp_path))))
    names = [u.name for u in units]
    assert names[:2] == ["part-00-00", "part-00-01"] and names[-1] == "part-10-10"
    assert names == sorted(names) and [(u.uri, u.row_offset) for u in units] == sorted((u.uri, u.row_offset) for u in units)


def test_units_are_planned_linearly_in_row_groups():
    row_groups = [3] * 200_000 + [0, 5]
    t = time.perf_counter()
    spans = _spans(row_groups, unit_rows=7)
    assert time.perf_counter() - t < 2.0
    assert spans[0] == (0, 6, (0, 1)) and spans[-1] == (600_000, 5, (200_001,))
    assert sum(rows for _, rows, _ in spans) == sum(row_groups)


def test_resume_follows_from_the_listing_alone(tmp_path):
    manifest = Manifest(str(tmp_path / "out"))
    manifest.prepare({"job": 1}, overwrite=False)
    for name in ("part-00000-00000", "part-00000-00001"):
        manifest.commit({"name": name, "rows": 1})
    manifest.finish({}, success=False)
    (tmp_path / "out" / "_manifest" / "part-00000-00001.json").write_text("not json: never read to resume")
    (tmp_path / "out" / "_manifest" / f".part-00000-00002.json.{'c' * 32}.tmp").write_text("{}")
    assert Manifest(str(tmp_path / "out")).committed_names() == {"part-00000-00000", "part-00000-00001"}


SLOW_COMMITS = """
import sys, time
import jobs.manifest
from jobs.driver import run_job
from jobs.spec import JobSpec

put = jobs.manifest.Manifest._put_json
def slow(self, value, *parts):
    if parts[0] == jobs.manifest.MANIFEST_DIR:
        time.sleep(0.4)  # records queue up behind the dispatch loop
    put(self, value, *parts)
jobs.manifest.Manifest._put_json = slow
jobs.manifest.COMMIT_THREADS = 2
run_job(JobSpec.from_mapping(__import__("json").loads(sys.argv[1])))
"""


def test_driver_killed_in_the_middle_of_queued_commits_is_exactly_once(make_spec, reference, same_as_reference,
                                                                        count_commits, tmp_path):
    """Workers store shards faster than the (slowed) commit threads record them; SIGKILL
    the driver with records still queued: shards without a record are redone on resume,
    and the output equals the uninterrupted run's."""
    spec = make_spec(tmp_path / "out", backend="local")
    out = Path(spec.output)
    values = {k: v for k, v in spec.__dict__.items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen([sys.executable, "-c", SLOW_COMMITS, json.dumps(values)], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while driver.poll() is None and time.monotonic() < deadline:
            shards = len(list(out.glob("data/part-*.parquet")))
            if count_commits(out) >= 2 and shards > count_commits(out) + 1:
                break
            time.sleep(0.01)
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    committed, stored = count_commits(out), len(list(out.glob("data/part-*.parquet")))
    assert stored > committed >= 2 and committed < len(reference), (stored, committed)

    from jobs.driver import run_job
    from tests.jobs.conftest import one_torch_thread

    with one_torch_thread():
        outcome = run_job(spec)
    assert outcome.ok and outcome.report["units_run_now"] == len(reference) - committed
    same_as_reference(out)


def test_small_files_share_units_resume_and_quarantine_per_file(make_spec, single_thread, tmp_path):
    """50 files of 3 rows in units of 40 rows: 4 units of up to 13 files; row keys and
    quarantine records name each row's own file and row; a lost commit redoes one unit."""
    src = tmp_path / "in"
    src.mkdir()
    for f in range(50):
        texts = [f"file {f} row {r}" for r in range(3)]
        if f == 20:
            texts[1] = None
        pq.write_table(pa.table({"text": texts}), src / f"f{f:02d}.parquet")
    spec = make_spec(tmp_path / "out", input=str(src), backend="local", unit_rows=40, id_column=None)
    units = plan_units(spec, list_inputs(spec))
    assert [len(u.files()) for u in units] == [13, 13, 13, 11] and [u.num_rows for u in units] == [39, 39, 39, 33]
    assert [u.name for u in units] == ["part-00000-00000", "part-00013-00000", "part-00026-00000", "part-00039-00000"]

    from jobs.driver import run_job

    outcome = run_job(spec)
    assert outcome.ok and outcome.report["rows"] == 149 and outcome.report["rows_quarantined"] == 1
    out = tmp_path / "out"
    keys = pq.read_table(out / "data", columns=["row_key"]).column("row_key").to_pylist()
    assert keys == [f"{src / f'f{f:02d}.parquet'}#{r}" for f in range(50) for r in range(3) if (f, r) != (20, 1)]
    (error,) = pq.read_table(out / "_errors").to_pylist()
    assert (error["file"], error["row"], error["reason"]) == (str(src / "f20.parquet"), 1, "null text")

    (out / "_manifest" / "part-00013-00000.json").unlink()
    again = run_job(spec)
    assert again.ok and again.report["units_run_now"] == 1
    assert pq.read_table(out / "data", columns=["row_key"]).column("row_key").to_pylist() == keys


def _mixed_input(src: Path) -> None:
    """Small Parquet files that share a unit, a file split at row groups, JSONL files."""
    src.mkdir()
    for f in range(3):
        _write(src / f"a{f}.parquet", rows=3)
    _write(src / "b.parquet", rows=30, row_group_size=4)
    (src / "c.jsonl").write_text('{"id": 1, "text": "x"}\n{"id": 2, "text": "y"}\n')
    (src / "d.jsonl").write_text('{"id": 3, "text": "z"}\n')


def test_saved_plan_is_reused_while_the_listing_is_unchanged(tmp_path, monkeypatch):
    src = tmp_path / "in"
    _mixed_input(src)
    spec = JobSpec(input=str(src), output=str(tmp_path / "out"), model="-", id_column="id", unit_rows=10)
    files = list_inputs(spec)
    manifest = Manifest(spec.output)
    units, reused = saved_or_planned(spec, files, manifest)
    assert not reused and any(u.segments for u in units) and any(u.schema is not None for u in units)
    manifest.prepare({"job": 1}, overwrite=False)
    save_plan(manifest, spec, files, units)
    manifest.close()

    def no_footers(*_):
        raise AssertionError("a reused plan reads no footer")

    with monkeypatch.context() as m:
        m.setattr(jobs.plan, "_layouts", no_footers)
        again, reused = saved_or_planned(spec, list_inputs(spec), Manifest(spec.output))
    assert reused and again == units

    # another unit size, or a file rewritten (its mtime changes), plans again
    assert saved_or_planned(spec.model_copy(update={"unit_rows": 7}), files, Manifest(spec.output))[1] is False
    os.utime(src / "b.parquet", ns=(1, 1))
    changed = list_inputs(spec)
    assert changed != files and saved_or_planned(spec, changed, Manifest(spec.output)) == (plan_units(spec, changed), False)


def test_unreadable_saved_plan_plans_again_and_clear_removes_it(tmp_path):
    src = tmp_path / "in"
    _mixed_input(src)
    spec = JobSpec(input=str(src), output=str(tmp_path / "out"), model="-", id_column="id")
    files = list_inputs(spec)
    manifest = Manifest(spec.output)
    manifest.prepare({"job": 1}, overwrite=False)
    (tmp_path / "out" / PLAN).write_bytes(b"not a plan")
    assert saved_or_planned(spec, files, manifest) == (plan_units(spec, files), False)
    save_plan(manifest, spec, files, plan_units(spec, files))
    manifest.clear()
    manifest.close()
    assert not (tmp_path / "out" / PLAN).exists()


def test_unit_names_sort_in_input_order_past_100000_files(tmp_path):
    """100,001 files name their units with six digits, all of them, so names still sort
    in input order (JSONL files: planned without reading them)."""
    spec = JobSpec(input=str(tmp_path), output=str(tmp_path / "out"), model="-")
    files = [InputFile(f"{tmp_path}/f{i:06d}.jsonl", "jsonl", 10, "0") for i in range(100_001)]
    names = [u.name for u in plan_units(spec, files)]
    assert names[0] == "part-000000-00000" and names[-1] == "part-100000-00000"
    assert names == sorted(names) and len(set(names)) == len(files)
