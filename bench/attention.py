"""Packed grouped-query attention: kv heads read in place against repeated first.

    python -m bench.attention [--tokens 200000] [--heads 16] [--kv-heads 8] [--head-dim 128]

One layer's FlashAttention over a pack of sequences 20-400 tokens long (Qwen3-0.6B's
heads by default), causal, bf16: `states.attention`'s call with the kv heads as they are,
and the same kernel over kv heads repeated to the query heads' count (what the module did
before), with the copies. Prints ms per call and the largest difference between them.
"""

from __future__ import annotations

import argparse

import torch

from states.attention import _flash


def per_call_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.attention times FlashAttention: it needs a CUDA GPU")

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 401, (args.tokens // 20,), generator=g)
    lengths = lengths[: int((lengths.cumsum(0) <= args.tokens).sum())]
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to("cuda", torch.int32)
    total, longest, window = int(cu[-1]), int(lengths.max()), (-1, 0)
    q = torch.randn(total, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(total, args.kv_heads, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    groups = args.heads // args.kv_heads

    def in_place() -> torch.Tensor:
        return _flash(q, k, v, cu, longest, None, window)

    def repeated() -> torch.Tensor:
        return _flash(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), cu, longest, None, window)

    diff = (in_place().float() - repeated().float()).abs().max().item()
    print(f"# {total:,} tokens in {len(lengths)} sequences, {args.heads} query / {args.kv_heads} kv heads of {args.head_dim}, "
          f"causal, bf16; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| kv heads | ms per call |\n|---|---|")
    for name, fn in (("repeated first", repeated), ("in place", in_place)):
        print(f"| {name} | {per_call_ms(fn):.3f} |")
    print(f"# largest difference: {diff:.3g}")


if __name__ == "__main__":
    main()
