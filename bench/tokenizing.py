"""How a host's cores tokenize best: processes x Rayon threads per process.

    python -m bench.tokenizing --tokenizer DIR [--docs 40000] [--window-rows 256]

The GPU worker's tokenizing tasks are single-threaded processes (`workers.tokenize_pool`);
this measures the alternatives on the same corpus and windows: every split of the host's
CPUs into P processes of T threads (`RAYON_NUM_THREADS`), each process tokenizing its
share of the windows with pooljobs' `BatchTokenizer`, all released at once after
building the tokenizer and a warm-up. Prints tokens/s for each split, with BERT's
plain-text twin tokenizer (the default; `workers.tokenize`) and with the model's own
normalizer for every text.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from pathlib import Path


def _worker(threads: int, backend_json: str, plain: bool, windows: list[list[str]], barrier, results) -> None:
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    from workers.tokenize import BatchTokenizer

    tokenize = BatchTokenizer(backend_json, 512, False)
    if not plain:
        tokenize.plain = None
    tokenize(windows[0][:64])  # warm-up: builds the Rayon pool and touches the vocabulary
    barrier.wait()
    start, tokens = time.monotonic(), 0
    for texts in windows:
        tokens += int(tokenize(texts).offsets[-1])
    results.put((start, time.monotonic(), tokens))


def measure(processes: int, threads: int, backend_json: str, plain: bool, windows: list[list[str]]) -> float:
    """Tokens per second of `processes` x `threads` over all `windows` (dealt round-robin)."""
    ctx = mp.get_context("spawn")  # a fresh Rayon pool per process, sized by its environment
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(threads, backend_json, plain, windows[p::processes], barrier, results))
             for p in range(processes)]
    for proc in procs:
        proc.start()
    done = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return sum(d[2] for d in done) / (max(d[1] for d in done) - min(d[0] for d in done))


def main() -> None:
    from bench.__main__ import make_corpus

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json and vocab.txt")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--window-rows", type=int, default=256)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    args = parser.parse_args()
    texts = make_corpus(args.tokenizer, args.docs)
    windows = [texts[i : i + args.window_rows] for i in range(0, len(texts), args.window_rows)]
    backend_json = (args.tokenizer / "tokenizer.json").read_text()
    print(f"# {args.docs:,} docs in windows of {args.window_rows} rows, {args.cpus} CPUs")
    print("| processes | threads each | tokens/s | per CPU | model's normalizer: tokens/s | twin / model |")
    print("|---|---|---|---|---|---|")
    splits = [(1, 1), (args.cpus, 1), (args.cpus - 1, 1), (args.cpus // 2, 2), (args.cpus // 4, 4), (1, args.cpus)]
    for processes, threads in dict.fromkeys(s for s in splits if s[0] >= 1):
        rate, model = (measure(processes, threads, backend_json, plain, windows) for plain in (True, False))
        print(f"| {processes} | {threads} | {rate:,.0f} | {rate / (processes * threads):,.0f} | {model:,.0f} | {rate / model:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
