"""Reading one work unit's rows straight from storage, and checking its text columns.

A `Unit` is metadata only (file, row groups or whole file, output name); the worker that
runs it opens the file itself, so the driver never holds the corpus.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from workers import storage

FORMAT_OF_SUFFIX = {
    ".parquet": "parquet", ".pq": "parquet", ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
}
DATASET_FORMAT = {"ipc": "ipc", "jsonl": "json", "csv": "csv"}
PART_ROWS = 1024  # rows per part of a Parquet unit: its first part is enough for its first windows


class InputError(ValueError):
    """An input file or column cannot be used; the message names the file (and column)."""


@dataclass(frozen=True)
class Unit:
    """A slice of one input file that becomes one output shard."""

    name: str  # shard name, derived from positions in the sorted input listing only
    uri: str  # the input file
    format: str  # parquet | ipc | jsonl | csv
    row_offset: int  # index of the unit's first row within the file
    num_rows: int  # rows in the unit (-1: the whole file, counted when read)
    row_groups: tuple[int, ...] = ()  # parquet row groups; empty for other formats

    def row_keys(self, rows: int) -> list[str]:
        """`file#row` keys of the unit's first `rows` rows: the output key without an id
        column, stable for the same input."""
        return [f"{self.uri}#{r}" for r in range(self.row_offset, self.row_offset + rows)]


def read_unit(unit: Unit, columns: list[str], storage_options: dict | None = None) -> pa.Table:
    """The unit's rows, only `columns`. Raises InputError naming the file on any failure."""
    return pa.concat_tables(read_unit_parts(unit, columns, storage_options))


def read_unit_parts(unit: Unit, columns: list[str], storage_options: dict | None = None) -> Iterator[pa.Table]:
    """The unit's rows in order: a Parquet unit's in parts of `PART_ROWS` rows, other
    formats' whole. A worker tokenizes each part while it reads the next: on the H200,
    a first 5,000-row row group took 31 ms to read before the unit's first window could
    be sent, and the rest of a 20,000-row unit ~100 ms, which its third launch group
    waited for. Raises InputError naming the file on any failure."""
    fs, path = storage.resolve(unit.uri, storage_options)
    try:
        if unit.format == "parquet":
            with fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                _check_columns(pf.schema_arrow, columns, unit.uri)
                if not unit.row_groups:  # planned without metadata (unreadable footer): read it all
                    yield pf.read(columns=columns)
                    return
                groups = list(unit.row_groups)
                if not sum(pf.metadata.row_group(g).num_rows for g in groups):  # no rows: still the columns
                    yield pf.read_row_groups(groups, columns=columns)
                    return
                for batch in pf.iter_batches(PART_ROWS, row_groups=groups, columns=columns):
                    yield pa.Table.from_batches([batch])
            return
        dataset = ds.dataset(path, format=DATASET_FORMAT[unit.format], filesystem=fs)
        _check_columns(dataset.schema, columns, unit.uri)
        yield dataset.to_table(columns=columns)
    except InputError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {unit.uri}: {e}") from e


def _check_columns(schema: pa.Schema, columns: list[str], uri: str) -> None:
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise InputError(f"{uri}: no column {missing[0]!r}; the file has columns {schema.names}")


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_null(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def check_text_types(schema: pa.Schema, columns: list[str], uri: str) -> None:
    """Fail early (before any model loads) when a text column exists but holds no text."""
    for column in columns:
        if column in schema.names and not _is_text(schema.field(column).type):
            raise _not_text(uri, column, schema.field(column).type)


def _not_text(uri: str, column: str, kind: pa.DataType) -> InputError:
    return InputError(f"{uri}: column {column!r} has type {kind}; expected a string (or UTF-8 binary) column")


def text_column(table: pa.Table, column: str, uri: str) -> tuple[list[str | None], list[str | None]]:
    """(texts, reasons): texts with None where a row is unusable, and the reason for it.

    string, large_string and dictionary-encoded strings are read as is; binary is decoded
    as UTF-8 per row (invalid bytes quarantine that row); anything else is an InputError.
    """
    col = table.column(column)
    kind = col.type
    if pa.types.is_null(kind):  # e.g. a JSON field that is null in every row
        return [None] * len(col), ["null text"] * len(col)
    if pa.types.is_dictionary(kind):
        col, kind = col.cast(kind.value_type), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        texts = col.to_pylist()
        return texts, [("null text" if t is None else None) for t in texts]
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        texts, reasons = [], []
        for raw in col.to_pylist():
            if raw is None:
                texts.append(None), reasons.append("null text")
                continue
            try:
                texts.append(raw.decode("utf-8")), reasons.append(None)
            except UnicodeDecodeError as e:
                texts.append(None), reasons.append(f"invalid UTF-8 at byte {e.start}")
        return texts, reasons
    raise _not_text(uri, column, kind)

