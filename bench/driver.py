"""The driver's own costs at corpus scale, on the CPU (no model, no workers).

    python -m bench.driver [--files 100000] [--s3-files 100000] [--s3-servers s3rver,moto] [--commits 2000] [--tally-keys 10000000]

Prints one line per target of issue 22 with its figure and the machine's load:
  * plan N local one-row Parquet files into N units (`unit_rows=1`): `list_inputs` + `plan_units`;
  * resume with N committed units, local: the listing, the saved plan (no footer read) and
    one listing of `_manifest/`, up to the list of units left to dispatch;
  * the same two on an S3 test server (s3rver, or moto, the tests' server), run in a
    process of its own (`bench.s3_servers`), with the requests it answered and its CPU time;
  * per-commit cost on the dispatch thread (`Manifest.commit`) and to store the records
    (`flush`), local disk and S3, with requests per commit;
  * `jobs.verify`'s key tally over M int64 ids: peak memory growth and time, extrapolated to 10^9;
  * optionally (`--small-files N`) a job over many tiny Parquet files against one file of
    the same rows (tiny BERT, CPU).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from bench.s3_servers import SERVERS, S3ServerProcess
from jobs.manifest import MANIFEST_DIR, Manifest
from jobs.plan import list_inputs, plan_units, save_plan, saved_or_planned
from jobs.spec import JobSpec
from jobs.tally import RUN_KEYS, KeyTally

RECORD = {"rows": 50_000, "errors": 0, "tokens": 5_000_000, "padded_tokens": 5_100_000, "truncated": 0,
          "duplicate_ids": 0, "checksum": "0" * 64, "bytes": 80_000_000, "schema": "id: int64\nembedding: ...",
          "worker": "host:cuda:0", "seconds": {"read": 0.01, "forward": 0.8}, "wall_seconds": 0.9}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} CPUs"


def line(target: str, figure: str, met: bool | None = None) -> None:
    """One target: its figure, PASS/MISS (blank where the figure is extrapolated or has no
    target) and the machine's load."""
    verdict = "" if met is None else "PASS" if met else "MISS"
    print(f"{target:<58} {figure:<60} {verdict:<4} [{load()}]", flush=True)


def _corpus_file() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [0], "text": ["a row"]}), sink)
    return sink.getvalue().to_pybytes()


def _spec(input: str, output: str, options: dict | None = None) -> JobSpec:
    return JobSpec(input=input, output=output, model="-", id_column="id", unit_rows=1, storage_options=options or {})


def _plan(spec: JobSpec) -> tuple[float, float, list]:
    """(wall seconds, this process's CPU seconds, units)."""
    t, cpu = time.perf_counter(), time.process_time()
    units = plan_units(spec, list_inputs(spec))
    return time.perf_counter() - t, time.process_time() - cpu, units


def _resume(spec: JobSpec) -> tuple[float, int, bool]:
    """Seconds from start to the units left to dispatch: listing, saved plan, committed names."""
    t = time.perf_counter()
    files = list_inputs(spec)
    manifest = Manifest(spec.output, spec.storage_options)
    units, reused = saved_or_planned(spec, files, manifest)
    done = manifest.committed_names()
    todo = [u for u in units if u.name not in done]
    return time.perf_counter() - t, len(todo), reused


def _prepared(spec: JobSpec, units: list) -> Manifest:
    """The output as a job leaves it: claimed, its plan saved (the claim is released by the caller)."""
    manifest = Manifest(spec.output, spec.storage_options)
    manifest.prepare({"bench": spec.output}, overwrite=False)
    save_plan(manifest, spec, list_inputs(spec), units)
    return manifest


def bench_local(root: Path, files: int) -> None:
    data = _corpus_file()
    src = root / "in"
    for d in range(0, files, 1000):  # 1,000 files a directory, as corpora are usually laid out
        (src / f"d{d // 1000:04d}").mkdir(parents=True)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: (src / f"d{i // 1000:04d}" / f"f{i:06d}.parquet").write_bytes(data), range(files)))
    spec = _spec(str(src), str(root / "out"))
    seconds, cpu, units = _plan(spec)
    assert len(units) == files
    line(f"plan {files:,} local files (target <= 10 s at 100k)",
         f"{seconds:.2f} s ({seconds / files * 1e6:.0f} us/file; {cpu:.1f} CPU-s)",
         seconds * 100_000 / files <= 10)
    _prepared(spec, units).close()
    body = str(RECORD).encode()
    left = units[-1000:]
    with ThreadPoolExecutor(8) as pool:  # the records, written directly: only their names matter to resume
        list(pool.map(lambda u: (root / "out" / MANIFEST_DIR / f"{u.name}.json").write_bytes(body), units[:-1000]))
    seconds, todo, reused = _resume(spec)
    assert reused and todo == len(left)
    line(f"resume with {files - len(left):,} committed, local (target <= 5 s)",
         f"{seconds:.2f} s to the {todo:,} units left (plan reused)", seconds <= 5)


def bench_s3(server_type: type[S3ServerProcess], files: int, commits: int) -> None:
    """The local lines' planning and resume, and commits, on an S3 test server. Inputs lie
    a thousand to a prefix, as in `bench_local`."""
    with server_type() as server:
        where = f"{server.name} S3"
        options = server.options()
        server.seed_keys("bench", [f"in/d{i // 1000:04d}/f{i:06d}.parquet" for i in range(files)], _corpus_file())
        server.seed_keys("out", [], b"")  # outputs in a bucket of their own: moto walks a whole bucket per listed page
        spec = _spec("s3://bench/in/", "s3://out/job/", options)
        server.requests()
        cpu = server.cpu_seconds()
        seconds, client, units = _plan(spec)
        assert len(units) == files
        requests, cpu = server.requests(), server.cpu_seconds() - cpu
        line(f"plan {files:,} files on {where} (target <= 120 s at 100k)",
             f"{seconds:.1f} s ({seconds / files * 1e3:.2f} ms/file; {sum(requests.values()) / files:.2f} requests/file; "
             f"CPU-s: {server.name} {cpu:.0f}, planner {client:.0f})", seconds * 100_000 / files <= 120)
        _prepared(spec, units).close()
        left = units[-1000:]
        server.seed_keys("out", [f"job/{MANIFEST_DIR}/{u.name}.json" for u in units[:-1000]], str(RECORD).encode())
        server.requests()
        cpu = server.cpu_seconds()
        seconds, todo, reused = _resume(spec)
        assert reused and todo == len(left)
        requests, cpu = server.requests(), server.cpu_seconds() - cpu
        line(f"resume with {files - len(left):,} committed, {where} (target <= 60 s)",
             f"{seconds:.1f} s to the {todo:,} units left (plan reused; {sum(requests.values())} requests; "
             f"{server.name} {cpu:.0f} CPU-s)", seconds <= 60)
        _commits(Manifest("s3://out/commits/", options), commits, where, 2, server)


def _commits(manifest: Manifest, n: int, where: str, target: float, server: S3ServerProcess | None = None) -> None:
    manifest.prepare({"bench": where}, overwrite=False)
    if server is not None:
        server.requests()
    t = time.perf_counter()
    dispatch = 0.0
    for i in range(n):
        d = time.perf_counter()
        manifest.commit({**RECORD, "name": f"part-{i:05d}-00000"})
        dispatch += time.perf_counter() - d
    manifest.flush()
    total = time.perf_counter() - t
    requests = f", {sum(server.requests().values()) / n:.2f} requests/commit" if server is not None else ""
    manifest.close()
    line(f"commit on {where} (target <= {target:g} ms/unit on the dispatch thread)",
         f"{dispatch / n * 1e3:.3f} ms/unit dispatch, {total / n * 1e3:.2f} ms/unit stored{requests}",
         dispatch / n * 1e3 <= target)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _tally_peak(keys: int, unit: int) -> tuple[float, float]:
    """(peak resident MiB over the start, seconds) of a tally of `keys` shuffled int64 ids
    added a unit at a time, one repeat in each unit."""
    import numpy as np

    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    rng = np.random.default_rng(0)
    base = _rss()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t = time.perf_counter()
    with KeyTally() as tally:
        for start in range(0, keys, unit):
            ids = rng.permutation(np.arange(start, start + unit, dtype=np.int64))
            ids[0] = ids[1]
            tally.add(pa.array(ids))
        repeats, _ = tally.result()
    seconds = time.perf_counter() - t
    stop.set()
    watcher.join()
    assert repeats == keys // unit
    return (peak[0] - base) / 2**20, seconds


def bench_tally(keys: int, unit: int = 50_000) -> float:
    """`jobs.verify`'s exact repeat count over `keys` ids, in a fresh process (so that no
    earlier allocation hides growth); returns the peak growth in MiB."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        growth, seconds = pool.apply(_tally_peak, (keys, unit))
    line(f"verify's key tally over {keys:,} ids", f"peak +{growth:.0f} MiB, {seconds:.1f} s "
         f"(~{seconds * 1e9 / keys / 3600:.1f} h at 1e9 if linear)")
    return growth


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
         f"{seconds['small']:.1f} s vs {seconds['one']:.1f} s = {seconds['small'] / seconds['one']:.2f}x",
         seconds["small"] <= 2 * seconds["one"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.driver", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--s3-files", type=int, default=100_000)
    parser.add_argument("--s3-servers", default="s3rver", help=f"comma-separated, of: {', '.join(SERVERS)} (s3rver: Node.js, npm)")
    parser.add_argument("--commits", type=int, default=2_000)
    parser.add_argument("--tally-keys", type=int, nargs=2, default=[5_000_000, 20_000_000],
                        help="two id counts, both above jobs.tally.RUN_KEYS: memory must not grow between them")
    parser.add_argument("--small-files", type=int, default=0, help="also run the small-files job (tiny BERT)")
    args = parser.parse_args()
    servers = args.s3_servers.split(",")
    if unknown := sorted(set(servers) - set(SERVERS)):
        parser.error(f"--s3-servers: unknown {', '.join(unknown)} (choose from {', '.join(SERVERS)})")
    print(f"bench.driver on {platform.node()} ({platform.processor() or platform.machine()}), {load()}")
    root = Path(tempfile.mkdtemp(prefix="bench-driver-"))
    try:
        bench_local(root, args.files)
        _commits(Manifest(str(root / "commits")), args.commits, "local disk", 1)
        for name in servers:
            bench_s3(SERVERS[name], args.s3_files, args.commits)
        small, large = args.tally_keys
        growth = [bench_tally(small), bench_tally(large)]
        line(f"verify memory, {small:,} -> {large:,} ids (bounded)", f"peak +{growth[0]:.0f} -> +{growth[1]:.0f} MiB",
             growth[1] <= 1.5 * growth[0] if min(small, large) > RUN_KEYS else None)
        if args.small_files:
            bench_small_files(root, args.small_files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
