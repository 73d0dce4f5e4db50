"""Turning output tensors into Arrow columns and committing Parquet files atomically.

A shard is serialized in memory, hashed, then put in one step: temp file + rename on
local disks, a single object put on object stores. A reader therefore sees a shard
whole or not at all, and its checksum is of exactly the bytes stored.
"""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from workers import storage


def embedding_array(values: np.ndarray, output_dtype: str) -> pa.Array:
    """(N, D) float32 -> fixed_size_list column in the storage dtype.

    int8 scales unit-range values by 127 (exact for normalized embeddings' range);
    binary keeps sign bits, 8 dimensions per uint8, as sentence-transformers' ubinary.
    """
    if output_dtype == "float32":
        flat = values.astype(np.float32, copy=False)
    elif output_dtype == "float16":
        flat = values.astype(np.float16)
    elif output_dtype == "int8":
        flat = np.clip(np.rint(values * 127.0), -127, 127).astype(np.int8)
    elif output_dtype == "binary":
        flat = np.packbits(values > 0, axis=1)
    else:
        raise ValueError(f"output_dtype={output_dtype!r}; choose float32, float16, int8 or binary")
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def output_columns(outputs: dict[str, np.ndarray], output_dtype: str, labels: list[str] | None) -> dict[str, pa.Array]:
    """The task's output columns, from the runtime's (N, ...) float32 arrays."""
    cols: dict[str, pa.Array] = {}
    if "embedding" in outputs:
        cols["embedding"] = embedding_array(outputs["embedding"], output_dtype)
    if "score" in outputs:
        cols["score"] = pa.array(outputs["score"].astype(np.float32))
    if "probs" in outputs:
        best = pa.array(outputs["probs"].argmax(axis=1))
        cols["label"] = pa.array(labels).take(best) if labels else best
        cols["probs"] = embedding_array(outputs["probs"], "float32")
    if "logits" in outputs:
        cols["logits"] = embedding_array(outputs["logits"], "float32")
    return cols


def _is_vector(kind: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type)


def serialize(table: pa.Table) -> tuple[pa.Buffer, str]:
    """Parquet bytes of `table` and their sha256. Float vectors are stored plain: their
    mantissas do not compress (lz4 grew them), and dictionaries and min/max statistics
    on them cost write time for nothing; keys and labels keep lz4, dictionaries, stats."""
    other = [f.name for f in table.schema if not _is_vector(f.type)]
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression={f.name: "none" if _is_vector(f.type) else "lz4" for f in table.schema},
                   use_dictionary=other, write_statistics=other)
    buf = sink.getvalue()
    return buf, hashlib.sha256(memoryview(buf)).hexdigest()


def put_atomic(uri: str, data: pa.Buffer, storage_options: dict | None = None) -> None:
    """Store `data` at `uri` so no reader ever sees a partial file."""
    fs, path = storage.resolve(uri, storage_options)
    try:
        if storage.is_local(fs):
            parent, name = path.rsplit("/", 1)
            fs.create_dir(parent, recursive=True)
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
            try:
                with fs.open_output_stream(tmp) as out:
                    out.write(data)
                fs.move(tmp, path)
            finally:
                if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    fs.delete_file(tmp)
        else:
            with fs.open_output_stream(path) as out:  # one object put (multipart commits on close)
                out.write(data)
    except OSError as e:
        raise OSError(f"cannot write {uri}: {e}") from e


def write_table(uri: str, table: pa.Table, storage_options: dict | None = None) -> tuple[int, str]:
    """Serialize and atomically store a Parquet table; (bytes, sha256)."""
    buf, digest = serialize(table)
    put_atomic(uri, buf, storage_options)
    return buf.size, digest
