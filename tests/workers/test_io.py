"""Reading text columns, writing output columns and atomic shards."""

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workers.reader import InputError, Unit, read_unit, read_unit_parts, text_column
from workers.writer import ShardWriter, embedding_array, put_atomic, write_table


def test_text_column_types():
    table = pa.table({
        "s": pa.array(["a", None, ""]),
        "d": pa.array(["x", "y", "x"]).dictionary_encode(),
        "b": pa.array([b"ok", b"\xff\xfe", None], pa.binary()),
        "n": pa.array([1, 2, 3]),
    })
    assert text_column(table, "s", "f") == (["a", None, ""], [None, "null text", None])
    assert text_column(table, "d", "f")[0] == ["x", "y", "x"]
    texts, reasons = text_column(table, "b", "f")
    assert texts == ["ok", None, None]
    assert reasons[1].startswith("invalid UTF-8") and reasons[2] == "null text"
    with pytest.raises(InputError, match=r"f: column 'n' has type int64"):
        text_column(table, "n", "f")


def test_missing_column_lists_the_columns(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"body": ["a"]}), path)
    with pytest.raises(InputError, match=r"no column 'text'.*\['body'\]"):
        read_unit(Unit("part-0", str(path), "parquet", 0, 1, (0,)), ["text"])


def _vector(kind: pa.DataType, size: int) -> pa.DataType:
    return pa.list_(pa.field("item", kind, nullable=False), size)


def test_parquet_unit_is_read_in_parts_of_part_rows(tmp_path, monkeypatch):
    import workers.reader

    table = pa.table({"id": np.arange(500), "text": [f"t{i}" for i in range(500)], "other": np.zeros(500)})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=100)
    monkeypatch.setattr(workers.reader, "PART_ROWS", 64)
    unit = Unit("u", str(tmp_path / "in.parquet"), "parquet", 100, 300, row_groups=(1, 2, 3))
    parts = list(read_unit_parts(unit, ["text", "id"]))
    assert [p.num_rows for p in parts] == [64, 64, 64, 64, 44] and parts[0].schema.names == ["text", "id"]
    assert pa.concat_tables(parts).equals(table.select(["text", "id"]).slice(100, 300))
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)
    (part,) = read_unit_parts(Unit("e", str(empty), "parquet", 0, 0, row_groups=(0,)), ["text"])
    assert part.num_rows == 0 and part.schema.names == ["text"]


def test_embedding_dtypes():
    v = np.array([[0.5, -0.25, 1.0, -1.0, 0.1, 0.2, -0.3, 0.4, 0.9]], dtype=np.float32)
    assert embedding_array(v, "float32").type == _vector(pa.float32(), 9)
    assert embedding_array(v, "float16").type == _vector(pa.float16(), 9)
    q = embedding_array(v, "int8", ranges=np.array([[-1.0] * 9, [1.0] * 9], np.float32))
    assert q.type == _vector(pa.int8(), 9) and q[0].as_py()[:4] == [63, -33, 126, -128]  # float32 steps, as quantize_embeddings
    b = embedding_array(v, "ubinary")
    assert b.type == _vector(pa.uint8(), 2)
    assert b[0].as_py() == [int("10101101", 2), int("10000000", 2)]


def test_shard_writer_streams_row_groups_in_order(tmp_path):
    vectors = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    shard = ShardWriter(str(tmp_path / "s.parquet"), row_group_bytes=200)  # a row group every few writes
    shard.write(pa.table({"id": pa.array([], pa.int64()), "embedding": embedding_array(vectors[:0], "float32")}))
    for a in range(0, 40, 5):
        shard.write(pa.table({"id": np.arange(a, a + 5), "embedding": embedding_array(vectors[a : a + 5], "float32")}))
    size, digest = shard.commit()
    data = (tmp_path / "s.parquet").read_bytes()
    assert size == len(data) and digest == hashlib.sha256(data).hexdigest() and shard.rows == 40
    meta = pq.ParquetFile(tmp_path / "s.parquet").metadata
    assert 1 < meta.num_row_groups < 8  # several writes per row group, more than one group
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.column("id").to_pylist() == list(range(40))
    np.testing.assert_array_equal(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)), vectors)
    assert not table.schema.field("embedding").nullable and table.schema.field("id").nullable


def test_shard_writer_with_no_rows_keeps_the_columns(tmp_path):
    shard = ShardWriter(str(tmp_path / "s.parquet"))
    shard.write(pa.table({"id": pa.array([], pa.string()), "score": pa.array([], pa.float32())}))
    shard.commit()
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.num_rows == 0 and table.schema.names == ["id", "score"]


def test_shard_is_hidden_until_commit_and_abort_leaves_nothing(tmp_path):
    table = pa.table({"id": np.arange(1000), "embedding": embedding_array(np.ones((1000, 64), np.float32), "float32")})
    kept, dropped = ShardWriter(str(tmp_path / "out" / "a.parquet"), row_group_bytes=1), ShardWriter(str(tmp_path / "out" / "b.parquet"), row_group_bytes=1)
    kept.write(table), dropped.write(table)  # a row group each, streamed to disk
    hidden = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(hidden) == 2 and all(n.startswith((".a.parquet.", ".b.parquet.")) and n.endswith(".tmp") for n in hidden)
    dropped.abort()
    size, digest = kept.commit()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.parquet"]
    data = (tmp_path / "out" / "a.parquet").read_bytes()
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert pq.read_table(tmp_path / "out" / "a.parquet").equals(pa.Table.from_arrays(table.columns, schema=kept.schema))


def test_atomic_put_leaves_only_the_file(tmp_path):
    size, digest = write_table(str(tmp_path / "out" / "s.parquet"), pa.table({"a": [1, 2]}))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["s.parquet"]
    assert pq.read_table(tmp_path / "out" / "s.parquet").num_rows == 2 and len(digest) == 64 and size > 0


def test_put_error_names_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="cannot write .*file/sub/s.parquet"):
        put_atomic(str(blocker / "sub" / "s.parquet"), b"data")
