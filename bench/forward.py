"""Device-only forward throughput of one model shape, eager and under compile variants.

    python -m bench.forward --tokenizer DIR [--shape bert-base] [--docs 40000]

The end-to-end bench mixes the device's speed with the pipeline that feeds it; this runs
the device part alone. The corpus is tokenized and cut like a unit's launch groups
(256-row windows joined up to `GROUP_TOKENS`), packed with the job's planner, pinned,
and each variant runs every pack back to back; tokens/s is real tokens over CUDA time.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.__main__ import SHAPES, build_model, make_corpus, pooling_of, tokenize_corpus
from states import ragged
from states.compiling import GeluEpilogue, compile_blocks
from states.interface import Pack
from states.runtime import ModelOptions, Runtime
from workers.packing import build_pack, plan_packs
from workers.tokenize import Encoded
from workers.batching import GROUP_TOKENS, MAX_SEQS_PER_PACK

VARIANTS: dict[str, tuple[dict | None, bool]] = {  # name -> (compile_blocks kwargs, or None: eager; packs budgeted by real tokens)
    "eager": (None, True),
    "compiled-0.2": ({"gelu": GeluEpilogue()}, False),  # pooljobs 0.2: packs budgeted by rows x longest
    "compiled": ({"gelu": GeluEpilogue()}, True),  # the job's default
    "compiled-exact-gelu": ({}, True),  # Inductor's own GELU kernel (--exact-gelu)
    # Measured twice on the H200: +4%, then -7% (run-to-run noise); not adopted.
    "compiled-32bit-indexing": ({"gelu": GeluEpilogue(), "options": {"assume_32bit_indexing": True}}, True),
}


def group_packs(enc: Encoded, max_tokens: int, packed: bool, window_rows: int = 256) -> list[Pack]:
    """The corpus as launch-group packs (pinned)."""
    lengths, packs, start = enc.lengths, [], 0
    while start < len(lengths):
        stop = start
        while stop < len(lengths) and lengths[start:stop].sum() < GROUP_TOKENS:
            stop = min(len(lengths), stop + window_rows)
        group = enc.select(np.arange(start, stop))
        plans = plan_packs(group.lengths, max_tokens, MAX_SEQS_PER_PACK, packed)
        packs += [build_pack(group, plan).pin_memory() for plan in plans]
        start = stop
    return packs


def device_seconds(runtime: Runtime, packs: list[Pack], copy_home: bool = False) -> float:
    """CUDA time of every pack's compute back to back (with `copy_home`, and of copying each
    pack's outputs to the host, as a worker does: a pack's `Pending` outputs resolved once
    the next pack is queued)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    held = None
    for pack in [*packs, None]:
        out = None if pack is None else runtime.launch(pack.to("cuda", non_blocking=True))
        for value in ragged.resolve(held).values() if held is not None else ():
            if copy_home:
                value.to("cpu", non_blocking=True)
        held = out
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="bert-base", choices=list(SHAPES))
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--max-tokens", type=int, default=1 << 19)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()

    model_dir = build_model(args.shape, args.tokenizer, Path(tempfile.mkdtemp(prefix="pooljobs-forward-")))
    enc = tokenize_corpus(args.tokenizer, make_corpus(args.tokenizer, args.docs))
    tokens = int(enc.offsets[-1])
    pooling = pooling_of(args.shape)
    print(f"# {args.shape}: {tokens:,} tokens")
    for name in args.variants.split(","):
        torch._dynamo.reset()
        runtime = Runtime(ModelOptions(str(model_dir), pooling=pooling, normalize=True, compile="off"))
        compiling, packed = VARIANTS[name]
        packs = group_packs(enc, args.max_tokens, packed)
        if compiling is not None:
            compile_blocks(runtime.state.model, **compiling)
        device_seconds(runtime, packs)  # compiles, loads kernels
        best = min(device_seconds(runtime, packs) for _ in range(3))
        print(f"| {args.shape} | {name} | {len(packs)} packs | {tokens / best:,.0f} tokens/s | {best * 1e3:.0f} ms |", flush=True)
        del runtime
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
