"""Packing: every row lands in exactly one pack, budgets hold, positions restart per row."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing

from workers.packing import build_pack, pack_size, plan_packs
from workers.tokenize import Encoded, gather_index


def encoded(seqs: list[list[int]], types: list[list[int]] | None = None) -> Encoded:
    offsets = np.cumsum([0] + [len(x) for x in seqs])
    flat = lambda xs: np.array([t for x in xs for t in x], np.int32)  # noqa: E731
    n = len(seqs)
    return Encoded(flat(seqs), offsets, None if types is None else flat(types), np.zeros(n, bool), np.arange(n),
                   np.zeros(n, np.int32))


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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_plan_counts_real_tokens(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, size=1000)
    plans = plan_packs(lengths, max_tokens=2048, max_seqs=64, packed=True)
    assert sorted(np.concatenate([p.rows for p in plans]).tolist()) == list(range(1000))
    for p, after in zip(plans, plans[1:]):
        assert len(p.rows) <= 64 and lengths[p.rows].sum() <= 2048
        # Full: the next row would not have fitted (or the row count is at its bound).
        assert len(p.rows) == 64 or lengths[p.rows].sum() + lengths[after.rows[0]] > 2048
    # A pack of short rows holds more of them than `count * longest` would allow.
    assert len(plans) < len(plan_packs(lengths, max_tokens=2048, max_seqs=64))


def test_row_longer_than_budget_gets_its_own_pack():
    for packed in (False, True):
        plans = plan_packs(np.array([10, 5000, 10]), max_tokens=100, max_seqs=8, packed=packed)
        assert [len(p.rows) for p in plans] == [1, 2]
        assert plans[0].rows.tolist() == [1]


def test_build_pack_layout():
    enc = encoded([[1, 2, 3], [4], [5, 6]], [[0, 0, 0], [1], [0, 0]])
    pack = build_pack(enc, plan_packs(enc.lengths, 100, 10)[0])
    assert pack.input_ids.tolist() == [1, 2, 3, 5, 6, 4]  # longest first
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 1, 0]
    assert pack.cu_seqlens.tolist() == [0, 3, 5, 6]
    assert pack.token_type_ids.tolist() == [0, 0, 0, 0, 0, 1]
    assert pack.max_len == 3


@pytest.mark.parametrize("typed", [False, True])
@pytest.mark.parametrize("count", [1, 2, 7])
def test_pack_built_into_a_reused_buffer_is_the_same_pack(typed, count):
    rng = np.random.default_rng(count)
    seqs = [rng.integers(0, 100, rng.integers(1, 9)).tolist() for _ in range(count)]
    enc = encoded(seqs, [[i % 2] * len(s) for i, s in enumerate(seqs)] if typed else None)
    plan = plan_packs(enc.lengths, 100, 10)[0]
    fresh = build_pack(enc, plan)
    buffer = torch.full((pack_size(enc, plan) + 5,), -7, dtype=torch.int64)  # stale contents, room to spare
    reused = build_pack(enc, plan, buffer)
    for name in ("input_ids", "position_ids", "token_type_ids", "cu_seqlens"):
        a, b = getattr(fresh, name), getattr(reused, name)
        assert (a is None) == (b is None) == (name == "token_type_ids" and not typed)
        if a is not None:
            assert a.dtype == b.dtype and a.tolist() == b.tolist()
            assert b.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # views, no copies
    assert reused.cu_seqlens.dtype == torch.int32 and reused.cu_seqlens.tolist()[-1] == sum(map(len, seqs))
    assert buffer[pack_size(enc, plan):].tolist() == [-7] * 5  # nothing written past the pack


def test_texts_without_tokens_are_dropped_and_named():
    enc = encoded([[1, 2], [], [3]])
    kept, empty = enc.without_empty()
    assert empty.tolist() == [1]
    assert kept.source.tolist() == [0, 2] and [kept.sequence(m).tolist() for m in range(2)] == [[1, 2], [3]]


@pytest.mark.parametrize("seed", [0, 1])
def test_vectorized_gather_matches_per_row_concatenation(seed):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, 100, rng.integers(0, 20)).tolist() for _ in range(200)]
    enc = encoded(seqs)
    pick = rng.permutation(200)[:77]
    assert gather_index(enc.offsets[:-1][pick], enc.lengths[pick]).tolist() == [
        i for m in pick for i in range(enc.offsets[m], enc.offsets[m + 1])]
    sub = enc.select(pick)
    assert [sub.sequence(j).tolist() for j in range(len(pick))] == [seqs[m] for m in pick]
    nonempty = [m for m in range(200) if seqs[m]]
    plan = plan_packs(enc.lengths[nonempty], 10_000, 1000)[0]
    pack = build_pack(enc.select(np.array(nonempty)), plan)
    assert pack.input_ids.tolist() == [t for r in plan.rows for t in seqs[nonempty[r]]]


@pytest.mark.parametrize("rows,window", [(0, 1024), (5000, 1024), (10, 3), (130, 128), (100_000, 4096)])
def test_windows_ramp_up_then_cover_every_row_once(rows, window):
    from workers.batching import RAMP_ROWS, WindowCutter

    bounds = WindowCutter(window).take(rows, last=True)
    cutter = WindowCutter(window)  # the same rows arriving in three parts
    assert cutter.take(rows // 3, last=False) + cutter.take(rows // 2, last=False) + cutter.take(rows, last=True) == bounds
    covered = [i for a, b in bounds for i in range(a, b)]
    assert covered == list(range(rows))
    sizes = [b - a for a, b in bounds]
    assert all(s <= window for s in sizes) and (not sizes or sizes[0] == min(RAMP_ROWS, window, rows))
    assert all(x <= y for x, y in zip(sizes[:-2], sizes[1:-1]))  # non-decreasing up to the last (partial) one
    if rows == 5000:
        assert sizes[:5] == [16, 20, 25, 31, 38] and sizes[-1] == 899  # growing by a quarter up to the window size
    if rows == 100_000:
        assert max(sizes) == window


@pytest.mark.parametrize("chunk", [False, True])
def test_concatenated_windows_equal_one_window(chunk):
    """Windows merged into one launch group are the same as tokenizing their rows at once."""
    from workers.tokenize import BatchTokenizer, EncodedWindow, encode_window

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{w: i + 3 for i, w in enumerate("a b c d e f".split())}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tokenize = BatchTokenizer(tokenizer.to_str(), 6, False, chunk=chunk, stride=1)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(list("abcdef"), rng.integers(0, 12))) for _ in range(30)]
    rows = np.arange(100, 130)
    whole = encode_window(tokenize, rows, texts, None)
    parts = [encode_window(tokenize, rows[a:b], texts[a:b], None) for a, b in [(0, 7), (7, 8), (8, 30)]]
    joined = EncodedWindow.concat(parts)
    assert joined.kept.tolist() == whole.kept.tolist() and joined.rejected == whole.rejected
    for name in ("ids", "offsets", "truncated", "source", "chunk"):
        assert getattr(joined.encoded, name).tolist() == getattr(whole.encoded, name).tolist(), name
