"""A worker's whole unit path on the host, with a model that costs nothing: read, hash,
tokenize, pack, then the writer thread's reordering, copies and Parquet encoding.

    python -m bench.host --tokenizer DIR [--rows 200000] [--duplicates 0.3] [--dim 384] [--runs 2]

`UnitRunner.run` on the CPU over one unit of `bench.dedup`'s corpus, its runtime's `launch`
returning constant vectors of `--dim` at once: the figure is the most rows per second one
worker's host side can take through, whatever the device, and each stage's seconds per row
(the stages overlap: feed and tokenize run ahead of the launch, the writer behind it).
Where a GPU run's writer or read stage is near its wall, this reproduces it on any machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench.dedup import corpus
from states.interface import Pack


class FreeRuntime:
    """The `states.contract.WorkerRuntime` of an embedding model whose forward is free."""

    max_length, prompt, packed, ragged, labels, ranges, normalize = 512, "", True, frozenset(), None, None, True
    device = torch.device("cpu")

    def __init__(self, tokenizer, dim: int) -> None:
        self.tokenizer = tokenizer
        self.output_shapes = {"embedding": (dim,)}
        self._vectors = torch.full((4096, dim), dim ** -0.5)

    def launch(self, pack: Pack) -> dict[str, torch.Tensor]:
        return {"embedding": self._vectors[: pack.num_seqs]}

    def token_budget(self) -> int:
        return 65_536

    def provenance(self) -> dict[str, str]:
        return {"model": "free"}

    def fingerprint(self) -> str:
        return "free"


def main() -> None:
    from transformers import AutoTokenizer

    from workers.options import UnitOptions
    from workers.reader import Unit
    from workers.unit import UnitRunner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--duplicates", type=float, default=0.3)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pooljobs-host-"))
    texts = corpus(args.tokenizer, args.rows, args.duplicates)
    pq.write_table(pa.table({"id": np.arange(len(texts)), "text": texts}), root / "corpus.parquet", row_group_size=5000)
    groups = pq.ParquetFile(root / "corpus.parquet").metadata.num_row_groups
    runtime = FreeRuntime(AutoTokenizer.from_pretrained(args.tokenizer), args.dim)
    print(f"host: {len(texts):,} rows ({args.duplicates:.0%} duplicates), {args.dim}-d float32 vectors", flush=True)
    for dedup in (False, True):
        for run in range(args.runs):
            options = UnitOptions(output=str(root / f"out-{dedup}-{run}"), id_column="id", dedup=dedup)
            runner = UnitRunner(options, runtime, model_sha256="free")
            unit = Unit("bench", str(root / "corpus.parquet"), "parquet", 0, len(texts), tuple(range(groups)))
            try:
                t = time.perf_counter()
                result = runner.run(unit)
                wall = time.perf_counter() - t
            finally:
                runner.close()
            stages = "  ".join(f"{k} {v / len(texts) * 1e6:5.2f}" for k, v in result.seconds.items())
            print(f"  {'dedup' if dedup else 'no dedup':<9} {len(texts) / wall:>9,.0f} rows/s "
                  f"({result.tokens / wall / 1e6:5.2f}M tokens/s)  us/row: {stages}", flush=True)


if __name__ == "__main__":
    main()
