"""The driver's own costs at corpus scale, on the CPU (no model, no workers).

    python -m bench.driver [--files 100000] [--s3-files 2000] [--committed 100000] [--commits 2000]

Prints one line per target of issue 22 with its figure and the machine's load:
  * plan N local files (one-row-group Parquet files): `list_inputs` + `plan_units`;
  * plan on the moto S3 test server (fewer files; the per-file figure scales to 100k);
  * resume with N committed units: what is left, from one listing of `_manifest/`;
  * per-commit cost on the dispatch thread (`Manifest.commit`) and to store the records
    (`flush`), local disk and moto S3;
  * a job over many tiny Parquet files against one file of the same rows (tiny BERT, CPU).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.manifest import MANIFEST_DIR, Manifest
from jobs.plan import list_inputs, plan_units
from jobs.spec import JobSpec

RECORD = {"rows": 50_000, "errors": 0, "tokens": 5_000_000, "padded_tokens": 5_100_000, "truncated": 0,
          "duplicate_ids": 0, "checksum": "0" * 64, "bytes": 80_000_000, "schema": "id: int64\nembedding: ...",
          "worker": "host:cuda:0", "seconds": {"read": 0.01, "forward": 0.8}, "wall_seconds": 0.9}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} CPUs"


def line(target: str, figure: str) -> None:
    print(f"{target:<58} {figure:<44} [{load()}]", flush=True)


def _corpus_file() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [0], "text": ["a row"]}), sink)
    return sink.getvalue().to_pybytes()


def _spec(input: str, output: str, options: dict | None = None) -> JobSpec:
    return JobSpec(input=input, output=output, model="-", id_column="id", storage_options=options or {})


def _plan(spec: JobSpec) -> tuple[float, int]:
    t = time.perf_counter()
    units = plan_units(spec, list_inputs(spec))
    return time.perf_counter() - t, len(units)


def bench_plan_local(root: Path, files: int) -> None:
    data = _corpus_file()
    src = root / "in"
    for d in range(0, files, 1000):  # 1,000 files a directory, as corpora are usually laid out
        (src / f"d{d // 1000:04d}").mkdir(parents=True)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: (src / f"d{i // 1000:04d}" / f"f{i:06d}.parquet").write_bytes(data), range(files)))
    seconds, units = _plan(_spec(str(src), str(root / "out")))
    assert units == files
    line(f"plan {files:,} local files (target <= 10 s at 100k)", f"{seconds:.2f} s ({seconds / files * 1e6:.0f} us/file)")


def _s3_options(server) -> dict:
    return {"endpoint_override": server.endpoint, "scheme": "http", "access_key": "x", "secret_key": "x",
            "region": "us-east-1"}


def bench_s3(files: int, commits: int) -> None:
    from tests.jobs.test_s3 import MotoS3

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request

    with MotoS3() as server:
        options = _s3_options(server)
        pafs.S3FileSystem(**options, allow_bucket_creation=True).create_dir("bench")
        fs = pafs.S3FileSystem(**options)
        data = _corpus_file()

        def put(i: int) -> None:
            with fs.open_output_stream(f"bench/in/f{i:06d}.parquet") as out:
                out.write(data)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(files)))
        seconds, units = _plan(_spec("s3://bench/in/", "s3://bench/out/", options))
        assert units == files
        line(f"plan {files:,} files on moto S3 (target <= 120 s at 100k)",
             f"{seconds:.2f} s ({seconds / files * 1e3:.2f} ms/file, {seconds / files * 1e5:.0f} s at 100k)")
        _commits(Manifest("s3://bench/commits/", options), commits, "moto S3", "2 ms")


def _commits(manifest: Manifest, n: int, where: str, target: str) -> None:
    manifest.prepare({"bench": where}, overwrite=False)
    t = time.perf_counter()
    dispatch = 0.0
    for i in range(n):
        d = time.perf_counter()
        manifest.commit({**RECORD, "name": f"part-{i:05d}-00000"})
        dispatch += time.perf_counter() - d
    manifest.flush()
    total = time.perf_counter() - t
    manifest.close()
    line(f"commit on {where} (target <= {target}/unit on the dispatch thread)",
         f"{dispatch / n * 1e3:.3f} ms/unit dispatch, {total / n * 1e3:.2f} ms/unit stored ({n:,} records)")


def bench_resume(root: Path, committed: int) -> None:
    out = root / "resume"
    manifest = Manifest(str(out))
    manifest.prepare({"bench": "resume"}, overwrite=False)
    body = str(RECORD).encode()
    with ThreadPoolExecutor(8) as pool:  # the records, written directly: only their names matter here
        list(pool.map(lambda i: (out / MANIFEST_DIR / f"part-{i:06d}-00000.json").write_bytes(body), range(committed)))
    manifest.close()
    names = [f"part-{i:06d}-00000" for i in range(committed + 1000)]
    t = time.perf_counter()
    done = Manifest(str(out)).committed_names()
    todo = [n for n in names if n not in done]
    seconds = time.perf_counter() - t
    assert len(todo) == 1000
    line(f"resume with {committed:,} committed, local (target <= 5 s)", f"{seconds:.2f} s to what is left (one listing)")


def bench_small_files(root: Path, files: int, rows_each: int = 3) -> None:
    """`files` tiny Parquet files against one file of the same rows, tiny BERT on CPU."""
    import torch

    from jobs.driver import run_job
    from tests.jobs.fixtures_models import corpus_table, save_tiny_bert

    torch.set_num_threads(1)
    model = save_tiny_bert(root / "model")
    table = corpus_table(files * rows_each)
    (root / "small").mkdir()
    for f in range(files):
        pq.write_table(table.slice(f * rows_each, rows_each), root / "small" / f"f{f:05d}.parquet")
    pq.write_table(table, root / "one.parquet")
    seconds = {}
    for name, input in (("one", root / "one.parquet"), ("small", root / "small")):
        spec = JobSpec(input=str(input), output=str(root / f"out-{name}"), model=str(model), id_column="id",
                       device="cpu", backend="local", progress=False)
        t = time.perf_counter()
        assert run_job(spec).ok
        seconds[name] = time.perf_counter() - t
    line(f"{files:,} files of {rows_each} rows vs one file (target <= 2x)",
         f"{seconds['small']:.1f} s vs {seconds['one']:.1f} s = {seconds['small'] / seconds['one']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.driver", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--s3-files", type=int, default=2_000)
    parser.add_argument("--committed", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=2_000)
    parser.add_argument("--small-files", type=int, default=5_000)
    args = parser.parse_args()
    print(f"bench.driver on {platform.node()} ({platform.processor() or platform.machine()}), {load()}")
    root = Path(tempfile.mkdtemp(prefix="bench-driver-"))
    try:
        bench_plan_local(root, args.files)
        bench_resume(root, args.committed)
        _commits(Manifest(str(root / "commits")), args.commits, "local disk", "1 ms")
        bench_s3(args.s3_files, args.commits)
        bench_small_files(root, args.small_files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
