"""The Triton segment max equals the scatter path bit for bit on CUDA: sequences shorter
than, equal to and longer than a tile, sequences of one token, a width that is not a
multiple of the column tile, bf16/fp16/fp32 values, negative values only, and a running max
into an `out` that already holds values."""

from __future__ import annotations

import pytest
import torch

from states import segment_max
from states.segment_max import segment_max_

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

