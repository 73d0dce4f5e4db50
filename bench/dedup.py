"""Dedup and reuse, as a user meets them: whole `python -m jobs.embed` processes timed from
outside, over a corpus with exact duplicates, then over the same corpus a little changed.

    python -m bench.dedup --model DIR [--tokenizer DIR] [--rows 1000000] [--duplicates 0.3] [--device cuda]

The corpus is bench's log-normal-length texts over the model's WordPiece vocabulary: a
`1 - duplicates` share of distinct texts, the rest copies of them at random places,
in 10 Parquet files. Runs, each a cold process:
1. `--no-dedup` (every row computed), 2. the default (each distinct text once): the
   ratio is the issue's first target;
3. after 1% of the rows changed in place and 1% appended (an 11th file), `--reuse` the
   run-2 output into a new directory: its wall against run 2's, and a check that every
   row is present in order and each unchanged row's embedding is run 2's bytes.
Hashing: `workers.dedup.content_hashes` over every text on one thread, against run 1's wall.
Each line gives the wall, the job's steady `run_seconds` and their difference (fixed cost).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
FILES = 10


def corpus(vocab: Path, rows: int, duplicates: float, seed: int = 0) -> list[str]:
    from bench.__main__ import make_corpus

    distinct = make_corpus(vocab, max(1, round(rows * (1 - duplicates))), seed)
    rng = np.random.default_rng(seed + 1)
    texts = distinct + [distinct[i] for i in rng.integers(0, len(distinct), rows - len(distinct))]
    return [texts[i] for i in rng.permutation(rows)]


def write(texts: list[str], directory: Path, first_id: int = 0, files: int = FILES, name: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(texts), files + 1).astype(int)
    for f, (a, b) in enumerate(zip(bounds, bounds[1:])):
        ids = np.arange(first_id + a, first_id + b)
        pq.write_table(pa.table({"id": ids, "text": texts[a:b]}), directory / f"part-{name + f:03d}.parquet",
                       row_group_size=5000)


def job(data: Path, out: Path, model: Path, device: str, *flags: str) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "jobs.embed", "--input", str(data), "--output", str(out), "--model", str(model),
               "--id-column", "id", "--device", device, "--no-progress", *flags]
    t = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        raise RuntimeError(f"{' '.join(flags)}: exit {done.returncode}:\n{done.stdout[-3000:]}")
    return wall, json.loads((out / "_report.json").read_text())


def line(what: str, wall: float, report: dict) -> str:
    run = report["run_seconds"]
    stages = "  ".join(f"{k} {v:.1f}" for k, v in report["stage_seconds"].items())
    return (f"{what:<34} wall {wall:7.1f}s  run {run:6.1f}s  fixed {wall - run:5.1f}s  computed "
            f"{report['rows_computed']:>9,}  copied {report['rows_deduplicated']:>9,}  reused {report['rows_reused']:>9,}"
            f"\n    stage seconds (summed over units; they overlap): {stages}; compile {report['decisions']['compile']}")


def embeddings_by_id(out: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(out / "data", columns=["id", "embedding"])
    column = table.column("embedding").combine_chunks()
    values = column.flatten().to_numpy().reshape(len(column), -1)
    ids = table.column("id").to_numpy()
    order = np.argsort(ids)
    return ids[order], values[order]


def main() -> None:
    from workers.dedup import content_hashes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a model directory with a WordPiece vocab.txt")
    parser.add_argument("--tokenizer", type=Path, help="a directory with the WordPiece vocab.txt the corpus is drawn "
                        "from (default: --model)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--duplicates", type=float, default=0.3, help="share of rows that copy another row's text")
    parser.add_argument("--changed", type=float, default=0.01, help="share changed in place, and again appended")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    vocab = args.tokenizer or args.model
    root = Path(tempfile.mkdtemp(prefix="pooljobs-dedup-"))
    t = time.perf_counter()
    texts = corpus(vocab, args.rows, args.duplicates)
    write(texts, root / "data")
    print(f"dedup: {args.rows:,} rows, {len(set(texts)):,} distinct ({args.duplicates:.0%} duplicates), "
          f"device {args.device}, corpus built in {time.perf_counter() - t:.0f}s, folder {root}", flush=True)

    t = time.perf_counter()
    content_hashes(texts, None, [None] * len(texts))
    hashing = time.perf_counter() - t
    plain_wall, plain = job(root / "data", root / "plain", args.model, args.device, "--no-dedup")
    print(line("--no-dedup", plain_wall, plain), flush=True)
    dedup_wall, dedup = job(root / "data", root / "dedup", args.model, args.device)
    print(line("dedup (default)", dedup_wall, dedup), flush=True)
    print(f"  -> dedup {plain_wall / dedup_wall:.2f}x faster end to end (target >= 1.35x); steady run "
          f"{plain['run_seconds'] / dedup['run_seconds']:.2f}x", flush=True)
    print(f"  hashing {len(texts):,} texts on one thread: {hashing:.2f}s = {hashing / plain_wall:.2%} of the "
          f"--no-dedup wall (target <= 2%)", flush=True)

    rng = np.random.default_rng(7)
    n = max(1, round(args.rows * args.changed))
    fresh = corpus(vocab, 2 * n, 0.0, seed=11)
    changed = rng.choice(args.rows, n, replace=False)
    for k, i in enumerate(changed):
        texts[i] = fresh[k]
    write(texts, root / "data")  # in place: the same files, rewritten
    write(fresh[n:], root / "data", first_id=args.rows, files=1, name=FILES)
    again_wall, again = job(root / "data", root / "again", args.model, args.device, "--reuse", str(root / "dedup"))
    print(line(f"--reuse after {args.changed:.0%} changed + appended", again_wall, again), flush=True)
    print(f"  -> {again_wall / dedup_wall:.1%} of the full dedup run's wall (target <= 5%); steady run "
          f"{again['run_seconds'] / dedup['run_seconds']:.1%}", flush=True)

    ids, after = embeddings_by_id(root / "again")
    before_ids, before = embeddings_by_id(root / "dedup")
    assert np.array_equal(ids, np.arange(args.rows + n)) and np.array_equal(before_ids, np.arange(args.rows)), \
        "rows missing or repeated"
    keep = np.ones(args.rows, bool)
    keep[changed] = False
    equal = (after[:args.rows][keep].view(np.uint8) == before[keep].view(np.uint8)).all(axis=1)
    print(f"  every one of {len(ids):,} rows present once; unchanged rows byte-equal to the previous output: "
          f"{int(equal.sum()):,} of {int(keep.sum()):,}", flush=True)


if __name__ == "__main__":
    main()
