"""Turning output tensors into Arrow columns and committing Parquet files atomically.

A shard is serialized as its rows arrive (a row group whenever enough have gathered, so
a unit's last window is all that is left to encode when the device is done) and hashed
on the way out: to a hidden temp file renamed on commit on local disks, to memory put as
one object on commit on object stores. A reader therefore sees a shard whole or not at
all, its checksum is of exactly the bytes stored, and committing the last unit (on the
critical path at the end of a job) no longer hashes and writes the whole file then.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from states.quantization import quantize
from workers import storage


def embedding_array(values: np.ndarray, output_dtype: str, ranges: np.ndarray | None = None) -> pa.Array:
    """(N, D) float32 -> fixed_size_list column in `output_dtype` (`states.quantization.quantize`)."""
    return vector_array(quantize(values, output_dtype, ranges))


def vector_array(values: np.ndarray) -> pa.Array:
    """(N, D) -> fixed_size_list<D> of non-null values: declared required, Parquet
    writes no definition levels for them (faster to write)."""
    kind = pa.list_(pa.field("item", pa.from_numpy_dtype(values.dtype), nullable=False), values.shape[1])
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), type=kind)


def list_array(values: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A ragged output's (values (N, ...), lengths (B,)) -> list<item> of B non-null rows;
    an item of shape (D,) is a fixed_size_list<D>."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    items = vector_array(values) if values.ndim == 2 else pa.array(values)
    kind = pa.list_(pa.field("item", items.type, nullable=False))
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=kind)


def output_columns(outputs: dict[str, np.ndarray | tuple[np.ndarray, np.ndarray]], output_dtype: str,
                   labels: list[str] | None, ranges: np.ndarray | None = None) -> dict[str, pa.Array]:
    """The task's output columns, from the runtime's (N, ...) float32 arrays; embeddings in
    `output_dtype` as sentence-transformers' `quantize_embeddings` defines it (`ranges`:
    the job's (2, D) int8/uint8 calibration, `Runtime.ranges`). Ragged outputs come as
    (values, lengths): `sparse_indices` list<int32> and `sparse_values` list<float32> (by
    ascending index), `multivector` list<fixed_size_list<float32 or float16>[D]>."""
    cols: dict[str, pa.Array] = {}
    if "embedding" in outputs:
        cols["embedding"] = embedding_array(outputs["embedding"], output_dtype, ranges)
    if "sparse_indices" in outputs:
        cols["sparse_indices"] = list_array(outputs["sparse_indices"][0].astype(np.int32), outputs["sparse_indices"][1])
        cols["sparse_values"] = list_array(outputs["sparse_values"][0].astype(np.float32), outputs["sparse_values"][1])
    if "multivector" in outputs:
        values, lengths = outputs["multivector"]
        cols["multivector"] = list_array(quantize(values, output_dtype), lengths)
    if "score" in outputs:
        cols["score"] = pa.array(outputs["score"].astype(np.float32))
    if "probs" in outputs:
        best = pa.array(outputs["probs"].argmax(axis=1))
        cols["label"] = pa.array(labels).take(best) if labels else best
        cols["probs"] = vector_array(outputs["probs"].astype(np.float32, copy=False))
    if "logits" in outputs:
        cols["logits"] = vector_array(outputs["logits"].astype(np.float32, copy=False))
    return cols


ROW_GROUP_BYTES = 8 << 20  # small enough that the last one is quick to encode, large enough to read well


def _is_vector(kind: pa.DataType) -> bool:
    """Output values (vectors, sparse weights, token vectors): stored plain, never null."""
    return pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind)


class _HashingFile:
    """A write-only file object for `pq.ParquetWriter`: sha256s the bytes on their way to `out`."""

    closed = False

    def __init__(self, out: AtomicFile) -> None:
        self.out, self.sha256, self.size = out, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha256.update(view)  # releases the GIL on large buffers
        self.out.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class ShardWriter:
    """One Parquet file, written row group by row group (to a local temp file, or to
    memory for object stores), stored on `commit`; `abort` leaves nothing behind.

    Vector columns are declared non-null and stored plain: their mantissas do not
    compress (lz4 grew them), and dictionaries and min/max statistics on them cost write
    time for nothing; keys and labels keep lz4, dictionaries and statistics."""

    def __init__(self, uri: str, storage_options: dict | None = None, row_group_bytes: int = ROW_GROUP_BYTES) -> None:
        self.uri, self.storage_options, self.row_group_bytes = uri, storage_options, row_group_bytes
        self._atomic: AtomicFile | None = None  # opened with the first row group
        self._file: _HashingFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._pending: list[pa.Table] = []
        self.rows = 0

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def write(self, table: pa.Table) -> None:
        """Append rows (all calls with the same columns); the first call fixes the schema."""
        if self._schema is None:
            fields = [f.with_nullable(False) if _is_vector(f.type) else f for f in table.schema]
            self._schema = pa.schema(fields, metadata=table.schema.metadata)
        self.rows += table.num_rows
        if table.num_rows:
            self._pending.append(pa.Table.from_arrays(table.columns, schema=self._schema))
        if sum(t.nbytes for t in self._pending) >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        try:
            if self._writer is None:
                self._open()
                other = [f.name for f in self._schema if not _is_vector(f.type)]
                self._writer = pq.ParquetWriter(
                    pa.PythonFile(self._file, mode="w"), self._schema, use_dictionary=other, write_statistics=other,
                    compression={f.name: "none" if _is_vector(f.type) else "lz4" for f in self._schema})
            if self._pending:
                table = pa.concat_tables(self._pending)
                self._writer.write_table(table, row_group_size=table.num_rows)
                self._pending = []
        except (OSError, pa.ArrowException) as e:  # e.g. a full disk, named with the shard
            raise OSError(f"cannot write {self.uri}: {e}") from e

    def _open(self) -> None:
        self._atomic = AtomicFile(self.uri, self.storage_options)
        self._file = _HashingFile(self._atomic)

    def commit(self) -> tuple[int, str]:
        """Finish the file and store it atomically; (bytes, sha256). The bytes were hashed
        and written as they were encoded, so only the last row group is left here."""
        assert self._schema is not None, "a shard needs at least one write, empty or not"
        self._flush()
        try:
            self._writer.close()
            self._atomic.commit()
        except (OSError, pa.ArrowException) as e:
            self.abort()
            raise OSError(f"cannot write {self.uri}: {e}") from e
        return self._file.size, self._file.sha256.hexdigest()

    def abort(self) -> None:
        """Drop the shard: close the writer and the file, leaving nothing behind."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._atomic is not None:
            self._atomic.abort()


class AtomicFile:
    """A file that appears whole on `commit` or not at all (`abort`): on local disks a
    hidden temp file beside it, renamed on commit; on object stores memory, stored as
    one object put on commit. Errors are the filesystem's; callers name the file."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self._fs, self._path = storage.resolve(uri, storage_options)
        self._tmp: str | None = None
        if storage.is_local(self._fs):
            parent, name = self._path.rsplit("/", 1)
            self._fs.create_dir(parent, recursive=True)
            self._tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"  # hidden: datasets skip it
            self._out = self._fs.open_output_stream(self._tmp)
        else:
            self._out = pa.BufferOutputStream()

    def write(self, data) -> None:
        self._out.write(data)

    def commit(self) -> None:
        if self._tmp is None:
            data = self._out.getvalue()
            with self._fs.open_output_stream(self._path) as out:  # one object put (multipart commits on close)
                out.write(data)
            return
        self._out.close()
        self._fs.move(self._tmp, self._path)
        self._tmp = None

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._out.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._fs.delete_file(self._tmp)
            self._tmp = None


def put_atomic(uri: str, data: pa.Buffer, storage_options: dict | None = None) -> None:
    """Store `data` at `uri` so no reader ever sees a partial file."""
    atomic = None
    try:
        atomic = AtomicFile(uri, storage_options)
        atomic.write(data)
        atomic.commit()
    except OSError as e:
        if atomic is not None:
            atomic.abort()
        raise OSError(f"cannot write {uri}: {e}") from e


def write_table(uri: str, table: pa.Table, storage_options: dict | None = None) -> tuple[int, str]:
    """Serialize and atomically store a Parquet table; (bytes, sha256)."""
    writer = ShardWriter(uri, storage_options)
    writer.write(table)
    return writer.commit()
