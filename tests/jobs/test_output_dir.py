"""The output directory has one writer and pooljobs touches only its own files in it:
a second writer is refused (a dead one's claim is broken), `--overwrite` leaves foreign
files, a job that committed nothing locks nothing, temp files of an aborted shard go, an
output inside the input is not read as input, and a changed input is never served stale."""

import json
import os
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.driver import run_job
from jobs.manifest import CLAIM, Manifest, OutputConflictError


@pytest.fixture
def small(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for f in range(2):
        pq.write_table(pa.table({"id": [f * 10 + i for i in range(6)], "text": [f"text number {i}" for i in range(6)]}),
                       src / f"f{f}.parquet", row_group_size=3)
    return src


def _spec(make_spec, src, out, **changes):
    return make_spec(out, input=str(src), backend="local", unit_rows=3, **changes)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_writer_is_refused_and_writes_nothing(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    holder = Manifest(str(out))
    holder.prepare({"job": "another"}, overwrite=False)  # a live job (this process) holds the claim
    with pytest.raises(OutputConflictError, match=rf"being written by another pooljobs job \(host {socket.gethostname()}, "
                                                  rf"pid {os.getpid()}.*delete .*{CLAIM}"):
        run_job(_spec(make_spec, small, out))
    assert not list(out.glob("data/part-*")) and json.loads((out / "_job.json").read_text()) == {"job": "another"}
    holder.close()
    assert not (out / CLAIM).exists()
    assert run_job(_spec(make_spec, small, out)).ok  # the holder committed nothing: its output locks nothing
    assert not (out / CLAIM).exists()


def test_a_dead_jobs_claim_is_broken_and_a_remote_one_is_named(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / CLAIM).write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "t", "since": "then"}))
    with pytest.raises(OutputConflictError, match=rf"host elsewhere, pid 1, since then\).*delete {out / CLAIM} and rerun"):
        run_job(_spec(make_spec, small, out))
    (out / CLAIM).write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "token": "t"}))
    assert run_job(_spec(make_spec, small, out)).ok
    assert not (out / CLAIM).exists()


def test_overwrite_removes_only_pooljobs_files(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    assert run_job(_spec(make_spec, small, out)).ok
    (out / "notes.txt").write_text("mine")
    (out / "_manifest" / "README").write_text("mine too")
    (out / "part-mine.parquet").write_text("not a pooljobs shard name")
    outcome = run_job(_spec(make_spec, small, out, dim=16, overwrite=True))
    assert outcome.ok and outcome.report["units_run_now"] == 4
    assert (out / "notes.txt").read_text() == "mine" and (out / "_manifest" / "README").exists()
    assert (out / "part-mine.parquet").exists()
    assert pq.read_schema(out / "data" / "part-00000-00000.parquet").field("embedding").type.list_size == 16


def test_foreign_directory_is_refused_even_with_overwrite(make_spec, small, tmp_path):
    out = tmp_path / "spark"
    out.mkdir()
    for name in ("part-00000-00000.parquet", "_SUCCESS", "notes.txt"):
        (out / name).write_text("theirs")
    for overwrite in (False, True):
        with pytest.raises(OutputConflictError, match="not written by pooljobs") as error:
            run_job(_spec(make_spec, small, out, overwrite=overwrite))
        assert "pass --overwrite" not in str(error.value)
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "notes.txt", "part-00000-00000.parquet"]


def test_a_job_that_committed_nothing_locks_nothing(make_spec, single_thread, small, tmp_path, monkeypatch):
    from workers.unit import UnitRunner

    out = tmp_path / "out"
    run = UnitRunner.run
    monkeypatch.setattr(UnitRunner, "run", lambda self, unit: (_ for _ in ()).throw(OSError("disk gone")))
    wrong = run_job(_spec(make_spec, small, out, normalize=True))  # every unit fails
    assert len(wrong.failed) == 4
    monkeypatch.setattr(UnitRunner, "run", run)
    outcome = run_job(_spec(make_spec, small, out))  # other settings, no --overwrite
    assert outcome.ok and outcome.report["units_committed"] == 4


def test_temp_files_of_an_aborted_shard_are_removed(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    assert run_job(_spec(make_spec, small, out)).ok
    debris = [out / "data" / f".part-00000-00001.parquet.{'a' * 32}.tmp", out / "_errors" / f".part-00000-00000.parquet.{'b' * 32}.tmp"]
    (out / "_errors").mkdir()
    for path in debris:
        path.write_bytes(b"x" * 100)
    assert run_job(_spec(make_spec, small, out)).report["units_run_now"] == 0
    assert not any(p.exists() for p in debris)


def test_output_inside_the_input_is_not_input_and_resumes(make_spec, single_thread, small):
    out = small / "embeddings"
    first = run_job(_spec(make_spec, small, out))
    assert first.ok and first.report["units"] == 4
    again = run_job(_spec(make_spec, small, out))
    assert again.ok and again.report["units"] == 4 and again.report["units_run_now"] == 0


def test_changed_input_of_the_same_size_is_refused_not_served_stale(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    assert run_job(_spec(make_spec, small, out)).ok
    path = small / "f1.parquet"
    before = path.stat()
    table = pq.read_table(path)
    pq.write_table(table.set_column(1, "text", pa.array([t.replace("number", "NUMBER") for t in table["text"].to_pylist()])),
                   path, row_group_size=3)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert path.stat().st_size == before.st_size
    with pytest.raises(OutputConflictError, match=r"differs in: input_sha256\)"):
        run_job(_spec(make_spec, small, out))


def test_shards_alone_in_data_read_by_polars_and_duckdb(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    assert run_job(_spec(make_spec, small, out)).ok
    assert sorted(p.name for p in (out / "data").iterdir()) == [f"part-0000{f}-0000{u}.parquet" for f in (0, 1) for u in (0, 1)]
    polars = pytest.importorskip("polars")
    frame = polars.scan_parquet(out / "data").collect()
    assert frame.height == 12 and sorted(frame["id"].to_list()) == [*range(6), *range(10, 16)]
    duckdb = pytest.importorskip("duckdb")
    dim = pq.read_schema(out / "data" / "part-00000-00000.parquet").field("embedding").type.list_size
    (count, cos), = duckdb.sql(f"SELECT count(*), min(array_cosine_similarity(embedding::FLOAT[{dim}], "
                               f"embedding::FLOAT[{dim}])) FROM read_parquet('{out}/data/*.parquet')").fetchall()
    assert count == 12 and cos == pytest.approx(1.0, abs=1e-5)


def test_an_output_in_the_earlier_layout_is_named_with_the_move(make_spec, single_thread, small, tmp_path):
    out = tmp_path / "out"
    assert run_job(_spec(make_spec, small, out)).ok
    for shard in (out / "data").iterdir():
        shard.rename(out / shard.name)
    with pytest.raises(OutputConflictError, match=r"earlier pooljobs layout.*mv OUT/part-\*.parquet OUT/data/"):
        run_job(_spec(make_spec, small, out))
    for shard in out.glob("part-*.parquet"):
        shard.rename(out / "data" / shard.name)
    assert run_job(_spec(make_spec, small, out)).report["units_run_now"] == 0
