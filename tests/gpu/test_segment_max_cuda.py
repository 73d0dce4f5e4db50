"""The Triton segment max equals the scatter path bit for bit on CUDA: sequences shorter
than, equal to and longer than a tile, sequences of one token, a width that is not a
multiple of the column tile, bf16/fp16/fp32 values, negative values only, and a running max
into an `out` that already holds values; the fused product-and-max (`linear_segment_max_`)
equals the product followed by the max up to float32 accumulation order."""

from __future__ import annotations

import pytest
import torch

from states import segment_max
from states.segment_max import GemmTiles, linear_segment_max_, segment_max_

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(segment_max.triton is None, reason="needs Triton")]

LENGTHS = [1, 1, 63, 64, 65, 1, 200, 3, 1000, 127, 128, 129, 2, 517]


def _seg(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths)).cuda()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("width", [1, 128, 1000, 30522])
def test_triton_equals_scatter(dtype, width):
    torch.manual_seed(width)
    seg = _seg(LENGTHS)
    values = (torch.randn(seg.numel(), width, device="cuda") * 4).to(dtype)
    got = torch.full((len(LENGTHS), width), float("-inf"), device="cuda")
    want = got.clone()
    segment_max_(got, values, seg, use_triton=True)
    segment_max_(want, values, seg, use_triton=False)
    assert torch.equal(got, want)
    assert torch.equal(want, torch.stack([v.float().amax(0) for v in values.split(LENGTHS)]))


def test_negative_values_and_running_max():
    """Chunks of one pack fold into one `out`: a sequence cut by a chunk edge gets the max of
    both parts; negative maxima survive (float32 atomics order negative values too)."""
    seg = _seg(LENGTHS)
    values = -torch.rand(seg.numel(), 777, device="cuda").to(torch.bfloat16) - 0.5
    got = torch.full((len(LENGTHS), 777), float("-inf"), device="cuda")
    for start in range(0, seg.numel(), 300):
        segment_max_(got, values[start:start + 300], seg[start:start + 300], use_triton=True)
    want = torch.full_like(got, float("-inf"))
    segment_max_(want, values, seg, use_triton=False)
    assert torch.equal(got, want) and bool((got < 0).all())



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [1, 1000, 30522])
@pytest.mark.parametrize("tiles", [GemmTiles(), GemmTiles(64, 256, 64, 8, 4, 4), GemmTiles(tma=True)])
def test_linear_segment_max_equals_the_product_then_the_max(dtype, width, tiles):
    """The fused product-and-max against float32 products of the same 16-bit operands, then
    a per-sequence amax: equal up to the order of float32 accumulation; a depth that is not
    a multiple of the tile's and a running max into an `out` that holds values."""
    if tiles.tma and segment_max.TensorDescriptor is None:
        pytest.skip("this Triton has no tensor descriptors")
    torch.manual_seed(width)
    seg = _seg(LENGTHS)
    x = torch.randn(seg.numel(), 200, device="cuda").to(dtype)
    weight = (torch.randn(width, 200, device="cuda") / 10).to(dtype)
    start = torch.randn(len(LENGTHS), width, device="cuda")
    got = start.clone()
    linear_segment_max_(got, x, weight, seg, tiles)
    products = x.float() @ weight.float().T
    want = torch.maximum(start, torch.stack([p.amax(0) for p in products.split(LENGTHS)]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
