"""Max over each sequence's tokens of a pack's (tokens x width) values, into (rows x width).

SPLADE's max pooling reduces (tokens x vocabulary) MLM logits to one row per sequence.
`torch.Tensor.scatter_reduce_` does that with one atomic per element, which for bf16 is a
compare-and-swap loop and costs more device time than the encoder's forward. On CUDA,
`segment_max_` runs a Triton kernel instead: each program reads a (BLOCK_T x BLOCK_V) tile
once, reduces the rows of each sequence the tile holds in registers, and issues one float32
atomic max per (sequence, column) per tile. Tokens are sorted by sequence in a pack, so a
tile holds few sequences and the atomics are a few percent of the elements read.

`linear_segment_max_` goes one step further for the vocabulary projection itself: it
computes `x @ weight.T` a tile at a time and folds each tile into the maxima the same way,
so the (tokens x vocabulary) logits never reach device memory (writing and reading them
back costs as much as the matrix product).

A max is exact in any order, so `segment_max_`'s two paths give the same values bit for
bit; the scatter path runs wherever Triton does not (the CPU).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without Triton
    triton = None
try:
    from triton.tools.tensor_descriptor import TensorDescriptor  # Triton >= 3.4
except ImportError:
    TensorDescriptor = None

BLOCK_T = 64  # tokens per tile
BLOCK_V = 128  # columns per tile


class GemmTiles(NamedTuple):
    """A tile shape of `linear_segment_max_` (Triton constexprs and launch settings)."""
    block_t: int = 128
    block_v: int = 128
    block_k: int = 64
    group_t: int = 8  # token tiles that sweep the columns together (L2 reuse of the weight)
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False  # operand tiles loaded through tensor descriptors (Hopper's TMA) instead of pointers


if triton is not None:
    @triton.jit
    def _fold(acc, seg_ptr, out_ptr, first_row, tokens, rows, cols, col_ok, stride_out, BLOCK_T: tl.constexpr):
        """out[s, cols] <- max(out[s, cols], max of acc's rows of segment s), for each
        segment s that a tile starting at token `first_row` holds."""
        seg = tl.load(seg_ptr + rows, mask=rows < tokens, other=-1)  # (BLOCK_T,) nondecreasing
        first = tl.load(seg_ptr + first_row)
        last = tl.load(seg_ptr + tl.minimum(first_row + BLOCK_T, tokens) - 1)
        for s in range(first, last + 1):
            best = tl.max(tl.where((seg == s)[:, None], acc, float("-inf")), axis=0)  # (BLOCK_V,)
            tl.atomic_max(out_ptr + s.to(tl.int64) * stride_out + cols, best, mask=col_ok, sem="relaxed")

    @triton.jit
    def _segment_max_kernel(x_ptr, seg_ptr, out_ptr, tokens, width, stride_x, stride_out,
                            BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr):
        first_row = tl.program_id(0) * BLOCK_T
        rows = first_row + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)  # (BLOCK_V,)
        row_ok, col_ok = rows < tokens, cols < width
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=float("-inf")).to(tl.float32)
        _fold(x, seg_ptr, out_ptr, first_row, tokens, rows, cols, col_ok, stride_out, BLOCK_T)

    @triton.jit
    def _linear_segment_max_kernel(x, w, seg_ptr, out_ptr, tokens, width, depth, stride_x, stride_w,
                                   stride_out, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                                   BLOCK_K: tl.constexpr, GROUP_T: tl.constexpr, TMA: tl.constexpr):
        """x, w: pointers to (tokens, depth) and (width, depth), or with TMA their tensor descriptors."""
        pid = tl.program_id(0)
        tiles_t, tiles_v = tl.cdiv(tokens, BLOCK_T), tl.cdiv(width, BLOCK_V)
        group = pid // (GROUP_T * tiles_v)
        group_first = group * GROUP_T
        group_size = tl.minimum(tiles_t - group_first, GROUP_T)
        tile_t = group_first + (pid % (GROUP_T * tiles_v)) % group_size
        tile_v = (pid % (GROUP_T * tiles_v)) // group_size
        first_row = tile_t * BLOCK_T
        rows = first_row + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
        cols = tile_v * BLOCK_V + tl.arange(0, BLOCK_V)  # (BLOCK_V,)
        row_ok, col_ok = rows < tokens, cols < width
        acc = tl.zeros((BLOCK_T, BLOCK_V), dtype=tl.float32)
        if TMA:  # out-of-bounds elements of a tile load as zeros
            for k in range(0, tl.cdiv(depth, BLOCK_K)):
                a = x.load([first_row, k * BLOCK_K])  # (BLOCK_T, BLOCK_K)
                b = w.load([tile_v * BLOCK_V, k * BLOCK_K])  # (BLOCK_V, BLOCK_K)
                acc = tl.dot(a, b.T, acc)
        else:
            ks = tl.arange(0, BLOCK_K)
            x_ptrs = x + rows[:, None].to(tl.int64) * stride_x + ks[None, :]  # (BLOCK_T, BLOCK_K)
            w_ptrs = w + cols[None, :].to(tl.int64) * stride_w + ks[:, None]  # (BLOCK_K, BLOCK_V): weight.T
            for k in range(0, tl.cdiv(depth, BLOCK_K)):
                k_ok = ks < depth - k * BLOCK_K
                a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                acc = tl.dot(a, b, acc)
                x_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
        _fold(acc, seg_ptr, out_ptr, first_row, tokens, rows, cols, col_ok, stride_out, BLOCK_T)


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


def fuses(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear_segment_max_` runs for these operands: CUDA with Triton, both in the
    same 16-bit float dtype (tensor-core products with float32 accumulation)."""
    return (triton is not None and x.is_cuda and weight.is_cuda and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16))


def linear_segment_max_(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, seg: torch.Tensor,
                        tiles: GemmTiles = GemmTiles()) -> None:
    """out (B, W) float32 <- max(out, max of (x @ weight.T)'s rows per segment), the products
    accumulated in float32 and never stored; x (T, K) and weight (W, K) 16-bit floats
    (`fuses`), seg (T,) int32 nondecreasing, as for `segment_max_`.

    A bias is not taken: max(a + b) = max(a) + b exactly (float addition is monotone), so
    the caller adds it to `out` once."""
    assert fuses(x, weight) and out.dtype == torch.float32 and x.shape[1] == weight.shape[1]
    assert out.shape[1] == weight.shape[0] and seg.shape[0] == x.shape[0]
    if x.shape[0] == 0:
        return
    x, weight, seg = x.contiguous(), weight.contiguous(), seg.to(torch.int32).contiguous()
    grid = (triton.cdiv(x.shape[0], tiles.block_t) * triton.cdiv(weight.shape[0], tiles.block_v),)
    a, b = x, weight
    if tiles.tma:
        a = TensorDescriptor.from_tensor(x, [tiles.block_t, tiles.block_k])
        b = TensorDescriptor.from_tensor(weight, [tiles.block_v, tiles.block_k])
    _linear_segment_max_kernel[grid](a, b, seg, out, x.shape[0], weight.shape[0], x.shape[1], x.stride(0),
                                     weight.stride(0), out.stride(0), BLOCK_T=tiles.block_t, BLOCK_V=tiles.block_v,
                                     BLOCK_K=tiles.block_k, GROUP_T=tiles.group_t, TMA=tiles.tma, num_warps=tiles.num_warps,
                                     num_stages=tiles.num_stages)
