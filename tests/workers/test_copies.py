"""workers.dedup on its own: content hashes, a unit's copies merged in input order, the
quarantine of a copy whose owner the tokenizer rejected, and the bounded cache."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from workers.dedup import BLOCK_IDS, Block, OutputCache, UnitCopies, content_hashes, refusal


def test_content_hashes():
    single = content_hashes(["ab", "ab", "a", None, "\ud800 lone surrogate"], None, [None, None, None, "null", None])
    assert single[0] == single[1] != single[2] and single[3] is None and len(single[0]) == 16
    pairs = content_hashes(["ab", "a", "ab"], ["c", "bc", "c"], [None] * 3)
    assert pairs[0] == pairs[2] != pairs[1]  # the split between text and pair counts
    assert pairs[0] != content_hashes(["abc"], None, [None])[0]


def values(rows: list[int]) -> tuple[np.ndarray, pa.Table]:
    """Computed output rows: each unit row's value is its number (so copies show their owner)."""
    return np.array(rows, np.int64), pa.table({"embedding": pa.array([float(r) for r in rows], pa.float64())})


def test_copies_merge_in_input_order_with_their_owners_values():
    a, b, c = (bytes([i]) * 16 for i in range(3))
    copies = UnitCopies(True, OutputCache(1 << 20), None)
    assert copies.classify([a, b, a]) == [True, True, False]
    assert copies.classify([None, c, b, a]) == [False, True, False, False]
    rows, table = copies.merge(*values([0, 1]))
    assert rows.tolist() == [0, 1]
    rows, table = copies.merge(*values([4]))  # copy row 2 (of 0) falls before it
    assert rows.tolist() == [2, 4] and table.column("embedding").to_pylist() == [0.0, 4.0]
    rows, table = copies.tail()
    assert rows.tolist() == [5, 6] and table.column("embedding").to_pylist() == [1.0, 0.0]
    assert copies.copies == 3 and copies.usable == 6 and not copies.orphans
    assert copies.hash_column().to_pylist() == [a, b, a, None, c, b, a]
    # the next unit copies from this worker's cache
    later = UnitCopies(True, copies.cache, None)
    assert later.classify([c, a]) == [False, False]
    rows, table = later.merge(*values([]))
    rows, table = later.tail()
    assert table.column("embedding").to_pylist() == [4.0, 0.0]


def test_a_copy_of_a_rejected_owner_is_an_orphan():
    a = b"\x01" * 16
    copies = UnitCopies(True, None, None)
    copies.classify([a, a])
    copies.merge(*values([]))  # the tokenizer rejected row 0: no output row
    rows, _ = copies.tail()
    assert rows.tolist() == [] and copies.orphans == {1: 0}


def test_disabled_computes_every_usable_row():
    a = b"\x01" * 16
    copies = UnitCopies(False, OutputCache(1 << 20), None)
    assert copies.classify([a, a, None]) == [True, True, False] and copies.copies == 0


def test_cache_evicts_oldest_but_found_values_stay():
    cache = OutputCache(max_bytes=100)
    table = pa.table({"x": pa.array(np.arange(10, dtype=np.float32))})  # 40 bytes
    keys = [bytes([i]) * 16 for i in range(4)]

    def add(key: bytes) -> None:
        cache.add(next(BLOCK_IDS), Block(table, np.array([3]), np.array([4])), [key], table.nbytes)

    for key in keys[:3]:
        add(key)
    copies = UnitCopies(True, cache, None)
    assert copies.classify([keys[1]]) == [False]  # found in the cache: the unit holds its block
    add(keys[3])
    assert [k in cache.codes for k in keys] == [False, False, True, True] and len(cache.blocks) == 2
    copies.merge(np.zeros(0, np.int64), table.slice(0, 0))
    rows, out = copies.tail()
    assert rows.tolist() == [0] and out.column("x").to_pylist() == [3.0]
    OutputCache(0).add(next(BLOCK_IDS), Block(table, np.array([0]), np.array([1])), [keys[0]], 40)  # keeps nothing


def test_copies_of_multi_row_sources_expand_in_order():
    """A source with one output row per window (overlong='chunk') is copied whole."""
    a, b = b"\x01" * 16, b"\x02" * 16
    copies = UnitCopies(True, None, None)
    assert copies.classify([a, b, b, a]) == [True, True, False, False]
    rows, table = copies.merge(np.array([0, 0, 1, 1, 1]), pa.table({"v": [0.0, 0.5, 1.0, 1.1, 1.2]}))
    rows, table = copies.tail()
    assert rows.tolist() == [2, 2, 2, 3, 3] and table.column("v").to_pylist() == [1.0, 1.1, 1.2, 0.0, 0.5]


def test_refusal_names_the_setting():
    base = {"model_sha256": "x", "dtype": "float32", "compiled": "False", "tokenizer": "nanotoken"}
    assert refusal(base, {**base, "compiled": "True", "tokenizer": "tokenizers"}) is None
    assert refusal(base, {**base, "dtype": "bfloat16"}) == "dtype: 'float32' there, 'bfloat16' here"
