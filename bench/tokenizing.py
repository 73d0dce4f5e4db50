"""Tokenizing cost per backend: CPU-seconds per 1M tokens, and tokens/s, on the bench corpus.

    python -m bench.tokenizing --tokenizer DIR [--docs 40000] [--window-rows 256] [--threads 1,0]
                               [--old-checkout PATH] [--pairs]

Each path tokenizes the corpus in windows of `--window-rows` texts, truncated at 512
tokens, as a worker does, in a fresh process (`RAYON_NUM_THREADS` set; 0 = every core):
  * old: `--old-checkout`'s `workers.tokenize.BatchTokenizer` (a checkout before the fast
    backends: HF `tokenizers` with BERT's plain-text twin, what the Ray tokenizing tasks ran),
  * reference: HF `tokenizers` on whole texts, its own truncation,
  * tokenizers, bounded: HF `tokenizers` on each text's bounded prefix,
  * the fast backend for the tokenizer (nanotoken for WordPiece, gigatoken for BPE), bounded.
CPU-seconds are the process's (all its threads); the ratio column is against the first path.
Every path's ids are checked equal to the reference's (and, with `--pairs`, token types).
`--pairs`: cross-encoder inputs instead, (query, text) with each query the first 8 words
of the next text; the backends take whole texts (pairs are never cut), no old path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import hashlib, json, sys, time
args = json.loads(sys.argv[1])
texts = json.loads(open(args["corpus"]).read())
queries = [" ".join(t.split()[:8]) for t in texts[1:] + texts[:1]] if args["pairs"] else None
backend_json = open(args["tokenizer"]).read()
if args["backend"] is None:  # the old checkout's own default path
    from workers.tokenize import BatchTokenizer
    tokenize = BatchTokenizer(backend_json, 512, False)
else:
    from workers.tokenize import TokenizerSpec
    tokenize = TokenizerSpec(backend_json, 512, args["pairs"], backend=args["backend"], bounded=args["bounded"],
                             pairs=args["pairs"]).build()
step = args["window_rows"]
windows = [(queries[i : i + step] if queries else texts[i : i + step], texts[i : i + step] if queries else None)
           for i in range(0, len(texts), step)]
tokenize(*windows[0])  # warm-up: thread pools, caches
digest, tokens = hashlib.sha256(), 0
cpu, wall = time.process_time(), time.perf_counter()
for window in windows:
    enc = tokenize(*window)
    tokens += int(enc.offsets[-1])
    digest.update(enc.ids.astype("int32").tobytes()); digest.update(enc.offsets.astype("int64").tobytes())
    if enc.type_ids is not None:
        digest.update(enc.type_ids.astype("int32").tobytes())
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu": cpu, "wall": wall, "tokens": tokens, "ids": digest.hexdigest()}))
"""


def measure(checkout: Path, backend: str | None, bounded: bool, threads: int, corpus: Path, tokenizer: Path,
            window_rows: int, pairs: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "TOKENIZERS_PARALLELISM": "true" if threads != 1 else "false"}
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    else:
        env.pop("RAYON_NUM_THREADS", None)
    arg = json.dumps({"corpus": str(corpus), "tokenizer": str(tokenizer), "backend": backend, "bounded": bounded,
                      "window_rows": window_rows, "pairs": pairs})
    done = subprocess.run([sys.executable, "-c", CHILD, arg], cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from bench.__main__ import make_corpus

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json and vocab.txt")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--window-rows", type=int, default=256)
    parser.add_argument("--threads", default="1,0", help="Rayon threads per process, comma-separated; 0 = every core")
    parser.add_argument("--old-checkout", type=Path, help="a pooljobs checkout whose default tokenizing is the anchor")
    parser.add_argument("--pairs", action="store_true", help="(query, text) pairs, as a cross-encoder job tokenizes")
    args = parser.parse_args()
    bound = not args.pairs

    kind = json.loads((args.tokenizer / "tokenizer.json").read_text())["model"]["type"]
    fast = {"WordPiece": "nanotoken", "BPE": "gigatoken"}.get(kind)
    form = "bounded prefix" if bound else "whole texts"
    paths = ([(f"old ({args.old_checkout})", args.old_checkout, None, False)] if args.old_checkout and bound else []) + [
        ("reference: HF tokenizers, whole texts", ROOT, "reference", False),
        (f"HF tokenizers, {form}", ROOT, "tokenizers", bound)] + (
        [(f"{fast}, {form}", ROOT, fast, bound)] if fast else [])
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.json"
        corpus.write_text(json.dumps(make_corpus(args.tokenizer, args.docs)))
        print(f"# {args.docs:,} {'(query, doc) pairs' if args.pairs else 'docs'} ({args.tokenizer.name}) in windows of {args.window_rows}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")
        print("| path | threads | tokens | CPU-s per 1M tokens | tokens/s (wall) | CPU-s vs first | ids |")
        print("|---|---|---|---|---|---|---|")
        for threads in (int(t) for t in args.threads.split(",")):
            runs = [(name, measure(checkout, backend, bounded, threads, corpus, args.tokenizer / "tokenizer.json",
                                   args.window_rows, args.pairs)) for name, checkout, backend, bounded in paths]
            anchor = runs[0][1]["cpu"] / runs[0][1]["tokens"] * 1e6
            reference = next(got["ids"] for name, got in runs if name.startswith("reference"))
            for name, got in runs:
                per_m = got["cpu"] / got["tokens"] * 1e6
                same = "= reference" if got["ids"] == reference else "DIFFER"
                print(f"| {name} | {threads or 'all'} | {got['tokens']:,} | {per_m:.3f} | {got['tokens'] / got['wall']:,.0f} | "
                      f"{per_m / anchor:.3f} | {same} |", flush=True)

if __name__ == "__main__":
    main()
