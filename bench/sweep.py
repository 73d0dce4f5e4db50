"""Whole processes, cold, at several corpus sizes: `python -m jobs.embed` against a plain
sentence-transformers script, each a subprocess timed from outside; then a warm notebook
column (a second `jobs.embed` call in one session against `SentenceTransformer.encode`).

    python -m bench.sweep --tokenizer DIR [--model-shape bert-base] [--sizes 1000,10000,40000,160000,1600000]
                          [--warm-size 40000] [--device cuda] [--compile auto] [--skip-st]

The model is a random-init `--model-shape` (bench's shapes; `tiny` for a CPU smoke run)
with the WordPiece files of `--tokenizer`, saved as plain transformers (sentence-
transformers adds mean pooling); the corpus is bench's log-normal-length texts. Inductor's
cache goes to a fresh folder, so the first pooljobs run starts with empty caches and the
later ones find what it left (said per row). Prints per size: both walls, the ratio
(ST wall / pooljobs wall), pooljobs' fixed cost (wall minus its steady `run_seconds`) and
the run's startup timeline; then the warm column. `--compile` is passed to
every pooljobs run (the default `auto` decides by the job's size, as a user's run does), so
one size can be timed with compiling off, on with the empty cache and on with a warm one.
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

from bench.startup import settle_bytecode

REPO = Path(__file__).resolve().parent.parent

ST_SCRIPT = """
import sys, time
import pyarrow as pa, pyarrow.parquet as pq, torch
from sentence_transformers import SentenceTransformer
corpus, model, out, device = sys.argv[1:5]
m = SentenceTransformer(model, device=device)
if device.startswith("cuda"):
    m.half()
t = pq.read_table(corpus)
e = m.encode(t.column("text").to_pylist(), batch_size=256, convert_to_numpy=True, normalize_embeddings=True)
pq.write_table(pa.table({"id": t.column("id"), "embedding": pa.FixedSizeListArray.from_arrays(
    pa.array(e.astype("float32").ravel()), e.shape[1])}), out)
"""

WARM_SCRIPT = """
import json, sys, time
import pyarrow.parquet as pq
corpus, model, device = sys.argv[1:4]
table = pq.read_table(corpus)
import jobs
times = []
for _ in range(2):
    t = time.perf_counter()
    jobs.embed(table, model=model, text_column="text", device=device, pooling="mean", normalize=True)
    times.append(time.perf_counter() - t)
from sentence_transformers import SentenceTransformer
m = SentenceTransformer(model, device=device)
if device.startswith("cuda"):
    m.half()
texts = table.column("text").to_pylist()
m.encode(texts[:512], batch_size=256)
t = time.perf_counter()
m.encode(texts, batch_size=256, convert_to_numpy=True, normalize_embeddings=True)
st = time.perf_counter() - t
jobs.shutdown()
print("RESULT " + json.dumps({"first": times[0], "second": times[1], "st_encode": st}))
"""


def timed(command: list[str], env: dict) -> float:
    t = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... exit {done.returncode}:\n{done.stdout[-3000:]}")
    return wall


def main() -> None:
    from bench.__main__ import SHAPES, build_model, make_corpus, write_corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--model-shape", default="bert-base", choices=list(SHAPES))
    parser.add_argument("--sizes", default="1000,10000,40000,160000,1600000")
    parser.add_argument("--warm-size", type=int, default=40000, help="rows of the warm notebook column (0: skip)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-st", action="store_true", help="time pooljobs only")
    parser.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="every pooljobs run's --compile")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="pooljobs-sweep-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "POOLJOBS_CACHE": str(root / "cache")}
    model = build_model(args.model_shape, args.tokenizer, root)
    print(f"sweep: shape {args.model_shape}, device {args.device}, folder {root}", flush=True)
    print(f"{'docs':>9} {'pooljobs s':>11} {'ST script s':>12} {'ST/pooljobs':>12} {'fixed s':>8} {'run s':>7} caches",
          flush=True)
    for i, n in enumerate(sizes):
        corpus = root / f"corpus-{n}.parquet"
        if not corpus.exists():  # a size may be listed twice: the later run finds the caches the first left
            write_corpus(make_corpus(args.tokenizer, n), corpus)
        out = root / f"out-{i}-{n}"
        wall = timed([sys.executable, "-m", "jobs.embed", "--input", str(corpus), "--output", str(out), "--model",
                      str(model), "--id-column", "id", "--pooling", "mean", "--normalize", "--device", args.device,
                      "--no-progress", "--compile", args.compile], env)
        report = json.loads((out / "_report.json").read_text())
        settled = settle_bytecode(root / "cache")
        st = None if args.skip_st else timed([sys.executable, "-c", ST_SCRIPT, str(corpus), str(model),
                                              str(root / f"st-{i}-{n}.parquet"), args.device], env)
        ratio = f"{st / wall:>11.2f}x" if st else f"{'-':>12}"
        print(f"{n:>9,} {wall:>11.1f} {st or 0:>12.1f} {ratio} {wall - report['run_seconds']:>8.1f} "
              f"{report['run_seconds']:>7.1f} {'empty' if i == 0 else 'warm'}  [{report['decisions']['backend']}; "
              f"compile {report['decisions']['compile']}]", flush=True)
        print("          startup: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.get("startup", {}).items())
              + f"; {settled}", flush=True)
    if args.warm_size:
        corpus = root / f"corpus-{args.warm_size}.parquet"
        if not corpus.exists():
            write_corpus(make_corpus(args.tokenizer, args.warm_size), corpus)
        done = subprocess.run([sys.executable, "-c", WARM_SCRIPT, str(corpus), str(model), args.device], env=env,
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"warm column failed:\n{done.stdout[-3000:]}")
        r = json.loads(line.removeprefix("RESULT "))
        print(f"notebook, {args.warm_size:,} rows: first call {r['first']:.1f}s, second call {r['second']:.1f}s, "
              f"SentenceTransformer.encode {r['st_encode']:.1f}s -> encode/second {r['st_encode'] / r['second']:.2f}x")


if __name__ == "__main__":
    main()
