"""Packing: every row lands in exactly one pack, budgets hold, positions restart per row."""

import numpy as np
import pytest

from workers.packing import build_pack, plan_packs
from workers.tokenize import Encoded


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_plan_covers_each_row_once_within_budget(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, size=1000)
    plans = plan_packs(lengths, max_tokens=2048, max_seqs=64)
    rows = np.concatenate([p.rows for p in plans])
    assert sorted(rows.tolist()) == list(range(1000))
    for p in plans:
        assert len(p.rows) <= 64
        assert len(p.rows) * lengths[p.rows].max() <= 2048 or len(p.rows) == 1


def test_row_longer_than_budget_gets_its_own_pack():
    plans = plan_packs(np.array([10, 5000, 10]), max_tokens=100, max_seqs=8)
    assert [len(p.rows) for p in plans] == [1, 2]
    assert plans[0].rows.tolist() == [1]


def test_build_pack_layout():
    ids = [np.array([1, 2, 3]), np.array([4]), np.array([5, 6])]
    enc = Encoded(ids, [np.zeros(3, int), np.ones(1, int), np.zeros(2, int)], np.zeros(3, bool), np.arange(3),
                  np.zeros(3, np.int32))
    pack = build_pack(enc, plan_packs(enc.lengths, 100, 10)[0])
    assert pack.input_ids.tolist() == [1, 2, 3, 5, 6, 4]  # longest first
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 1, 0]
    assert pack.cu_seqlens.tolist() == [0, 3, 5, 6]
    assert pack.token_type_ids.tolist() == [0, 0, 0, 0, 0, 1]
    assert pack.max_len == 3


def test_texts_without_tokens_are_dropped_and_named():
    enc = Encoded([np.array([1, 2]), np.zeros(0, np.int64), np.array([3])], None, np.zeros(3, bool), np.arange(3),
                  np.zeros(3, np.int32))
    kept, empty = enc.without_empty()
    assert empty.tolist() == [1]
    assert kept.source.tolist() == [0, 2] and [x.tolist() for x in kept.ids] == [[1, 2], [3]]
