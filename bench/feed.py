"""The GPU worker's host path per row, without a model: a unit read, hashed, classified
for copies and tokenized by the worker's own threads (`workers.feed`, `ThreadTokenizer`).

    python -m bench.feed --tokenizer DIR [--rows 200000] [--duplicates 0.3] [--runs 3]

The corpus is `bench.dedup`'s (bench's log-normal texts, a share of them repeated), one
Parquet file of 5,000-row groups, read as one unit. For each of `--dedup` off and on it
prints the feed thread's seconds per row (its `read` stage: reading, text extraction,
hashing, classifying) and the tokens per second of the feed and tokenizing threads
together: the most a worker's host side can hand the device, whatever the model.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from queue import SimpleQueue

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.dedup import corpus


def main() -> None:
    from transformers import AutoTokenizer

    from workers.dedup import UnitCopies
    from workers.feed import feed_unit
    from workers.options import UnitOptions
    from workers.reader import Unit
    from workers.tokenize_pool import ThreadTokenizer
    from workers.tokenizer_choice import choose_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--duplicates", type=float, default=0.3)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp(prefix="pooljobs-feed-")) / "corpus.parquet"
    texts = corpus(args.tokenizer, args.rows, args.duplicates)
    pq.write_table(pa.table({"id": np.arange(len(texts)), "text": texts}), path, row_group_size=5000)
    groups = pq.ParquetFile(path).metadata.num_row_groups
    unit = Unit("bench", str(path), "parquet", 0, len(texts), tuple(range(groups)))
    choice = choose_tokenizer(AutoTokenizer.from_pretrained(args.tokenizer), args.max_length)
    tokenizer = ThreadTokenizer(choice.spec)
    print(f"feed: {len(texts):,} rows ({args.duplicates:.0%} duplicates), tokenizer backend {choice.spec.backend}")
    try:
        for dedup in (False, True):
            options = UnitOptions(output=str(path.parent / "out"), id_column="id", dedup=dedup)
            for _ in range(args.runs):
                windows: SimpleQueue = SimpleQueue()
                t = time.perf_counter()
                source = feed_unit(unit, options, lambda first: tokenizer, windows, UnitCopies(dedup, None, None))
                tokens = 0
                while (pending := windows.get()) is not None:
                    tokens += pending.result().tokens
                seconds = time.perf_counter() - t
                print(f"  {'dedup' if dedup else 'no dedup':<9} read stage {source.read_seconds / len(texts) * 1e6:5.2f} us/row"
                      f"  feed + tokenize {seconds:5.2f}s = {tokens / seconds / 1e6:5.2f}M tokens/s"
                      f"  ({source.copies.copies:,} rows copies)", flush=True)
    finally:
        tokenizer.close()


if __name__ == "__main__":
    main()
