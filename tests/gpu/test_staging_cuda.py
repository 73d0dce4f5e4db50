"""Pinned staging on CUDA: packs arrive on the device intact while their host buffers are reused.

The device is held busy while many more packs than slots are staged, so each copy is still
queued when the launching thread comes back to its buffer; refilling a buffer before its
copy has read it would give an earlier pack a later pack's ids.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.encoded import Encoded
from workers.packing import PackPlan, build_pack
from workers.staging import PinnedStaging

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FIELDS = ("input_ids", "position_ids", "token_type_ids", "cu_seqlens")


def window(seed: int, rows: int, typed: bool) -> Encoded:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 200, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = rng.integers(0, 30_000, int(offsets[-1])).astype(np.int32)
    types = rng.integers(0, 2, len(ids)).astype(np.int32) if typed else None
    return Encoded(ids, offsets, types, np.zeros(rows, bool), np.arange(rows), np.zeros(rows, np.int32))


@pytest.mark.parametrize("typed", [False, True])
def test_staged_packs_equal_their_host_packs_under_buffer_reuse(typed):
    device = torch.device("cuda")
    staging = PinnedStaging(device, slots=3)
    cases = []
    for i in range(20):  # sizes grow and shrink, so buffers are regrown and reused
        enc = window(i, 5 + (i * 37) % 120, typed)
        cases.append((enc, PackPlan(np.random.default_rng(i).permutation(len(enc.lengths)))))
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time queued ahead of every copy
    staged = [staging.stage(enc, plan) for enc, plan in cases]
    torch.cuda.synchronize()
    for (enc, plan), pack in zip(cases, staged):
        expected = build_pack(enc, plan)
        assert pack.max_len == expected.max_len
        for name in FIELDS:
            got, want = getattr(pack, name), getattr(expected, name)
            if want is None:
                assert got is None
                continue
            assert got.device.type == "cuda" and got.dtype == want.dtype and got.is_contiguous()
            assert torch.equal(got.cpu(), want), name


def test_staged_cu_seqlens_are_the_int32_boundaries_varlen_kernels_read():
    staging = PinnedStaging(torch.device("cuda"))
    enc = window(0, 50, False)
    pack = staging.stage(enc, PackPlan(np.arange(50)))
    lengths = (pack.cu_seqlens[1:] - pack.cu_seqlens[:-1]).cpu().numpy()
    assert lengths.tolist() == enc.lengths.tolist() and pack.cu_seqlens.data_ptr() % 4 == 0
    assert int(pack.position_ids.max()) == pack.max_len - 1
