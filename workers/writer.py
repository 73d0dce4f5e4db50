"""Turning output tensors into Arrow columns and committing Parquet files atomically.

A shard is serialized as its rows arrive (a row group whenever enough have gathered, so
a unit's last window is all that is left to encode when the device is done): to a hidden
temp file renamed on commit on local disks, to memory put as one object on commit on
object stores. A reader therefore sees a shard whole or not at all, and its checksum is
of exactly the bytes stored.

Parquet writes straight into Arrow's native stream, never through a Python file object:
the encoder calls its sink once per page and header, and a Python sink takes the GIL for
each call, which the worker's feed, tokenizing and launching threads hold most of the time
(`python -m bench.host` shows the cost). The checksum is taken per row group from the
bytes written (read back from the temp file, GIL released), so committing the last unit
hashes only its last row group and the footer.

Each row group is encoded and hashed on a thread of the shard's own, one at a time and
in order, while the caller gathers the next: encoding releases the GIL, and the caller
(the worker's writer thread, which also orders, copies and assembles the rows) is the
busiest thread of a fast model's run.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

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


class ShardWriter:
    """One Parquet file, written row group by row group (to a local temp file, or to
    memory for object stores), stored on `commit`; `abort` leaves nothing behind.

    Vector columns are declared non-null and stored plain: their mantissas do not
    compress (lz4 grew them), and dictionaries and min/max statistics on them cost write
    time for nothing; keys and labels keep lz4, dictionaries and statistics."""

    def __init__(self, uri: str, storage_options: dict | None = None, row_group_bytes: int = ROW_GROUP_BYTES) -> None:
        self.uri, self.storage_options, self.row_group_bytes = uri, storage_options, row_group_bytes
        self._atomic: AtomicFile | None = None  # opened with the first row group
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._pending: list[pa.Table] = []
        self._encoder: ThreadPoolExecutor | None = None  # started with the first row group
        self._encoding: Future | None = None  # the row group being encoded, at most one
        self.rows = 0

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def write(self, table: pa.Table) -> None:
        """Append rows (all calls with the same columns); the first call fixes the schema.
        An error encoding an earlier row group is raised here or by `commit`."""
        if self._schema is None:
            fields = [f.with_nullable(False) if _is_vector(f.type) else f for f in table.schema]
            self._schema = pa.schema(fields, metadata=table.schema.metadata)
        self.rows += table.num_rows
        if table.num_rows:
            self._pending.append(pa.Table.from_arrays(table.columns, schema=self._schema))
        if sum(t.nbytes for t in self._pending) >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        """Hand the pending rows to the encoding thread as one row group, once the previous
        one is encoded (so row groups stay in order and at most two are held)."""
        self._wait()
        if self._pending:
            table = self._take_pending()
            if self._encoder is None:
                self._encoder = ThreadPoolExecutor(1, thread_name_prefix="encode")
            self._encoding = self._encoder.submit(self._encode, table)

    def _take_pending(self) -> pa.Table:
        """The pending rows as one row group's table, the file opened for it if not yet."""
        table = pa.concat_tables(self._pending)
        self._pending = []
        if self._writer is None:
            self._open()
        return table

    def _wait(self) -> None:
        encoding, self._encoding = self._encoding, None
        if encoding is not None:
            encoding.result()

    def _open(self) -> None:
        """Create the (hidden) file and its Parquet writer, with the first row group."""
        try:
            self._atomic = AtomicFile(self.uri, self.storage_options)
            other = [f.name for f in self._schema if not _is_vector(f.type)]
            self._writer = pq.ParquetWriter(
                self._atomic.stream, self._schema, use_dictionary=other, write_statistics=other,
                compression={f.name: "none" if _is_vector(f.type) else "lz4" for f in self._schema})
        except (OSError, pa.ArrowException) as e:
            raise OSError(f"cannot write {self.uri}: {e}") from e

    def _encode(self, table: pa.Table) -> None:
        """Encode and hash one row group (on the encoding thread)."""
        try:
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._atomic.hash_written()
        except (OSError, pa.ArrowException) as e:  # e.g. a full disk, named with the shard
            raise OSError(f"cannot write {self.uri}: {e}") from e

    def commit(self) -> tuple[int, str]:
        """Finish the file and store it atomically; (bytes, sha256)."""
        assert self._schema is not None, "a shard needs at least one write, empty or not"
        try:
            try:
                self._wait()
                if self._pending:  # the last row group: encoded here, nothing follows it
                    self._encode(self._take_pending())
                if self._writer is None:  # no rows: the file holds the schema alone
                    self._open()
            except OSError:  # named by `_open` or `_encode`
                self.abort()
                raise
            try:
                self._writer.close()
                return self._atomic.commit()
            except (OSError, pa.ArrowException) as e:
                self.abort()
                raise OSError(f"cannot write {self.uri}: {e}") from e
        finally:
            self._stop()

    def abort(self) -> None:
        """Drop the shard: close the writer and the file, leaving nothing behind."""
        with contextlib.suppress(Exception):
            self._wait()
        self._stop()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._atomic is not None:
            self._atomic.abort()

    def _stop(self) -> None:
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None


class AtomicFile:
    """A file that appears whole on `commit` or not at all (`abort`): on local disks a
    hidden temp file beside it, renamed on commit; on object stores memory, stored as
    one object put on commit. `commit` gives (bytes, sha256) of exactly what was stored.
    Errors are the filesystem's; callers name the file."""

    HASH_CHUNK = 16 << 20

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self._fs, self._path = storage.resolve(uri, storage_options)
        self._tmp: str | None = None
        self._sha256, self._hashed = hashlib.sha256(), 0
        self._written: pa.NativeFile | None = None  # the temp file read back for hashing
        if storage.is_local(self._fs):
            parent, name = self._path.rsplit("/", 1)
            self._fs.create_dir(parent, recursive=True)
            self._tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"  # hidden: datasets skip it
            self._out = self._fs.open_output_stream(self._tmp)  # unbuffered: bytes reach the file as written
        else:
            self._out = pa.BufferOutputStream()

    @property
    def stream(self) -> pa.NativeFile:
        """The native output stream, for writers that write to it directly (no Python per write)."""
        return self._out

    def write(self, data) -> None:
        self._out.write(data)

    def hash_written(self) -> None:
        """Hash the bytes of the temp file written since the last call (local disks; in
        memory everything is hashed on commit). Reads and hashing release the GIL."""
        if self._tmp is None:
            return
        if self._written is None:
            self._written = self._fs.open_input_file(self._tmp)
        end = self._out.tell()
        while self._hashed < end:
            chunk = self._written.read_buffer(min(self.HASH_CHUNK, end - self._hashed))  # sequential, as written
            self._sha256.update(chunk)
            self._hashed += chunk.size

    def commit(self) -> tuple[int, str]:
        if self._tmp is None:
            data = self._out.getvalue()
            self._sha256.update(data)
            with self._fs.open_output_stream(self._path) as out:  # one object put (multipart commits on close)
                out.write(data)
            return data.size, self._sha256.hexdigest()
        self.hash_written()
        self._written.close()
        self._out.close()
        self._fs.move(self._tmp, self._path)
        self._tmp = None
        return self._hashed, self._sha256.hexdigest()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._out.close()
        if self._written is not None:
            with contextlib.suppress(Exception):
                self._written.close()
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
