"""GELU on a bert-base FFN activation: how far is each way from a plain copy, and what
does the FFN's first matmul + GELU cost each way?

    python -m bench.gelu [--tokens 208000] [--hidden 768] [--width 3072]

The bert-base profile puts Inductor's fused GELU at 18.8% of device time. This prints the
time of a bf16 (tokens x width) tensor through a copy (the memory-traffic floor), eager
exact and tanh GELU, and `torch.compile`d GELU with dynamic shapes (what the per-layer
compile uses), static shapes, and two Inductor options. Then `gelu(linear(x))` from
hidden to width: the linear alone (the floor), eager, compiled with dynamic shapes, and
`linear_gelu` (bias + GELU in cuBLASLt's epilogue, what compiled blocks run), with each
one's largest difference from the exact GELU computed in fp32.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from states.compiling import linear_gelu


def milliseconds(fn, x: torch.Tensor, repeats: int = 20) -> float:
    fn(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=208_000)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--width", type=int, default=3072)
    args = parser.parse_args()
    x = torch.randn(args.tokens, args.width, device="cuda", dtype=torch.bfloat16)
    gelu = lambda a: F.gelu(a)  # noqa: E731
    cases = {
        "copy": lambda a: a.clone(),
        "eager exact": gelu,
        "eager tanh": lambda a: F.gelu(a, approximate="tanh"),
        "compiled, dynamic shapes": torch.compile(gelu, dynamic=True),
        "compiled, static shapes": torch.compile(gelu, dynamic=False),
        "compiled, dynamic, no fp32 upcast": torch.compile(gelu, dynamic=True, options={"triton.codegen_upcast_to_fp32": False}),
        "compiled, dynamic, 32-bit indexing": torch.compile(gelu, dynamic=True, options={"assume_32bit_indexing": True}),
        "compiled, dynamic, coordinate descent": torch.compile(gelu, dynamic=True, options={"coordinate_descent_tuning": True}),
    }
    for name, fn in cases.items():
        print(f"{name}: {milliseconds(fn, x):.3f} ms", flush=True)

    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(args.width, args.hidden, device="cuda", dtype=torch.bfloat16) / args.hidden**0.5
    b = torch.randn(args.width, device="cuda", dtype=torch.bfloat16) * 0.1
    exact = F.gelu(F.linear(x.float(), w.float(), b.float()))
    eager = lambda a: F.gelu(F.linear(a, w, b))  # noqa: E731
    print(f"linear alone: {milliseconds(lambda a: F.linear(a, w, b), x):.3f} ms", flush=True)
    cases = {
        "linear + GELU, eager": eager,
        "linear + GELU, compiled, dynamic shapes": torch.compile(eager, dynamic=True),
        "linear_gelu (cuBLASLt epilogue)": lambda a: linear_gelu(a, w, b),
    }
    for name, fn in cases.items():
        error = (fn(x).float() - exact).abs().max().item()
        print(f"{name}: {milliseconds(fn, x):.3f} ms, max |diff| from exact fp32 {error:.4f}", flush=True)


if __name__ == "__main__":
    main()
