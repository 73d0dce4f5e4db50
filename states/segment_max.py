"""Max over each sequence's tokens of a pack's (tokens x width) values, into (rows x width).

SPLADE's max pooling reduces (tokens x vocabulary) MLM logits to one row per sequence.
`torch.Tensor.scatter_reduce_` does that with one atomic per element, which for bf16 is a
compare-and-swap loop and costs more device time than the encoder's forward. On CUDA,
`segment_max_` runs a Triton kernel instead: each program reads a (BLOCK_T x BLOCK_V) tile
once, reduces the rows of each sequence the tile holds in registers, and issues one float32
atomic max per (sequence, column) per tile. Tokens are sorted by sequence in a pack, so a
tile holds few sequences and the atomics are a fraction of the elements read; short, wide
tiles keep the loop over a tile's sequences short (`bench.splade_head` picked the shape).

A max is exact in any order, so both paths give the same values bit for bit; the
scatter path runs wherever Triton does not (the CPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without Triton
    triton = None

BLOCK_T = 8  # tokens per tile
BLOCK_V = 1024  # columns per tile

if triton is not None:
    @triton.jit
    def _segment_max_kernel(x_ptr, seg_ptr, out_ptr, tokens, width, stride_x, stride_out,
                            BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr):
        first_row = tl.program_id(0) * BLOCK_T
        rows = first_row + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)  # (BLOCK_V,)
        row_ok, col_ok = rows < tokens, cols < width
        seg = tl.load(seg_ptr + rows, mask=row_ok, other=-1)  # (BLOCK_T,) nondecreasing
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=float("-inf")).to(tl.float32)
        first = tl.load(seg_ptr + first_row)
        last = tl.load(seg_ptr + tl.minimum(first_row + BLOCK_T, tokens) - 1)
        for s in range(first, last + 1):
            best = tl.max(tl.where((seg == s)[:, None], x, float("-inf")), axis=0)  # (BLOCK_V,)
            tl.atomic_max(out_ptr + s.to(tl.int64) * stride_out + cols, best, mask=col_ok, sem="relaxed")


def segment_max_(out: torch.Tensor, values: torch.Tensor, seg: torch.Tensor, use_triton: bool | None = None) -> None:
    """out (B, W) float32 <- max(out, max of values' rows per segment); values (t, W) in any
    float dtype, rows of any stride; seg (t,) int32, each row's segment (row of `out`), nondecreasing.

    `out` starts at -inf for a plain max. `use_triton` None takes the kernel wherever it can
    run (CUDA tensors with Triton installed); False forces the scatter path (tests, benches)."""
    assert out.dtype == torch.float32 and values.shape[1] == out.shape[1] and seg.shape[0] == values.shape[0]
    if use_triton is None:
        use_triton = triton is not None and values.is_cuda
    if not use_triton:
        out.scatter_reduce_(0, seg.long()[:, None].expand(values.shape), values.float(), reduce="amax")
        return
    if values.shape[0] == 0:
        return
    if values.stride(1) != 1:
        values = values.contiguous()
    seg = seg.to(torch.int32).contiguous()
    grid = (triton.cdiv(values.shape[0], BLOCK_T), triton.cdiv(values.shape[1], BLOCK_V))
    _segment_max_kernel[grid](values, seg, out, values.shape[0], values.shape[1], values.stride(0), out.stride(0),
                              BLOCK_T=BLOCK_T, BLOCK_V=BLOCK_V)
