"""Reading one work unit's rows straight from storage, and checking its text columns.

A `Unit` is metadata only (file, row groups or whole file, output name, the types its
columns are read as); the worker that runs it opens the file itself, so the driver never
holds the corpus.

JSONL and CSV are read with an explicit schema (the unit's `schema`: text columns as
strings, the id column as typed in the job's first file; other columns are not read), so
Arrow's type inference cannot refuse a file of digit-only texts or an id column that
changes type halfway. A line that cannot be read (invalid JSON, a wrong field count, a
value of the wrong type) stays a row: its columns are null (its id kept when it parses)
and its reason, naming the line, is in the reserved `READ_ERROR` column, which
`text_column` reports, so one bad line quarantines one row and every good line is kept.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson
import pyarrow.parquet as pq

from workers import storage

FORMAT_OF_SUFFIX = {
    ".parquet": "parquet", ".pq": "parquet", ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
}
DATASET_FORMAT = {"ipc": "ipc", "jsonl": "json", "csv": "csv"}
TEXT_FORMATS = ("jsonl", "csv")  # read line by line with an explicit schema
PART_ROWS = 1024  # rows per part of a Parquet unit: its first part is enough for its first windows
READ_ERROR = "_pooljobs_read_error"  # reserved column: why a JSONL/CSV line could not be read


class InputError(ValueError):
    """An input file or column cannot be used; the message names the file (and column)."""


@dataclass(frozen=True)
class Unit:
    """A slice of one input file, or several whole small Parquet files in input order
    (`segments`), that becomes one output shard. The fields describe the first file;
    `num_rows` counts the whole unit."""

    name: str  # shard name, derived from positions in the sorted input listing only
    uri: str  # the (first) input file
    format: str  # parquet | ipc | jsonl | csv
    row_offset: int  # index of the unit's first row within the file
    num_rows: int  # rows in the unit (-1: the whole file, counted when read)
    row_groups: tuple[int, ...] = ()  # parquet row groups; empty for other formats
    schema: pa.Schema | None = None  # JSONL/CSV: the types columns are read as (absent ones: string)
    segments: tuple[Unit, ...] = ()  # further whole files of a unit of small files (each with its rows)
    reuse: tuple[str, ...] = ()  # shards of a previous output whose rows this unit may copy (`workers.dedup`)

    def files(self) -> tuple[Unit, ...]:
        """The unit as single-file pieces, in order (itself when it has no segments)."""
        if not self.segments:
            return (self,)
        first = replace(self, segments=(), num_rows=self.num_rows - sum(s.num_rows for s in self.segments))
        return (first, *self.segments)

    def locate(self, rows: int) -> list[tuple[str, int]]:
        """(file, row within the file) of the unit's first `rows` rows."""
        found: list[tuple[str, int]] = []
        pieces = self.files()
        for i, piece in enumerate(pieces):
            take = rows - len(found) if i == len(pieces) - 1 else min(piece.num_rows, rows - len(found))
            found += [(piece.uri, r) for r in range(piece.row_offset, piece.row_offset + take)]
        return found

    def row_keys(self, rows: int) -> list[str]:
        """`file#row` keys of the unit's first `rows` rows: the output key without an id
        column, stable for the same input."""
        return [f"{uri}#{row}" for uri, row in self.locate(rows)]


def read_unit(unit: Unit, columns: list[str], storage_options: dict | None = None) -> pa.Table:
    """The unit's rows, only `columns`. Raises InputError naming the file on any failure."""
    return pa.concat_tables(read_unit_parts(unit, columns, storage_options))


def read_unit_parts(unit: Unit, columns: list[str], storage_options: dict | None = None) -> Iterator[pa.Table]:
    """The unit's rows in order: a Parquet unit's in parts of `PART_ROWS` rows (a worker
    tokenizes each part while it reads the next), other formats' whole, file after file.
    JSONL/CSV tables carry `READ_ERROR` after `columns` (null where the line was read).
    Raises InputError naming the file on any failure of a file as a whole."""
    for piece in unit.files():
        yield from _read_file(piece, columns, storage_options)


def _read_file(unit: Unit, columns: list[str], storage_options: dict | None) -> Iterator[pa.Table]:
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
        if unit.format in TEXT_FORMATS:
            with fs.open_input_stream(path) as f:
                data = f.read()
            yield read_text_format(data, unit.format, read_schema(unit.schema, columns), unit.uri)
            return
        dataset = ds.dataset(path, format=DATASET_FORMAT[unit.format], filesystem=fs)
        _check_columns(dataset.schema, columns, unit.uri)
        yield dataset.to_table(columns=columns)
    except InputError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"cannot read {unit.uri}: {e}") from e


def read_schema(schema: pa.Schema | None, columns: list[str]) -> pa.Schema:
    """`columns` with their types in `schema`, string where it has none."""
    return pa.schema([schema.field(c) if schema is not None and c in schema.names else pa.field(c, pa.string())
                      for c in columns])


def read_text_format(data: bytes, fmt: str, schema: pa.Schema, uri: str) -> pa.Table:
    """A JSONL or CSV file's `schema` columns. Arrow's reader first; when it refuses the
    file, line by line (`_json_lines`, `_csv_records`) so only the bad lines are lost.
    An empty file is a table of no rows."""
    if not data.strip():
        return _table({f.name: [] for f in schema}, [], schema)
    try:
        if fmt == "jsonl":
            options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            table = pajson.read_json(io.BytesIO(data), parse_options=options)
        else:
            convert = pacsv.ConvertOptions(column_types=schema, include_columns=schema.names)
            table = pacsv.read_csv(io.BytesIO(data), convert_options=convert)
    except pa.ArrowKeyError:  # a CSV header without one of the columns
        header = _csv_header(data)
        raise _missing(uri, [c for c in schema.names if c not in header][0], header) from None
    except pa.ArrowInvalid:
        if fmt == "csv":
            header = _csv_header(data)
            if any(c not in header for c in schema.names):
                raise _missing(uri, [c for c in schema.names if c not in header][0], header) from None
        table = _table(*(_json_lines if fmt == "jsonl" else _csv_records)(data, schema), schema)
    if fmt == "jsonl":
        _check_json_keys(table, data, uri)
    if READ_ERROR not in table.column_names:
        table = table.append_column(READ_ERROR, pa.nulls(table.num_rows, pa.string()))
    return table


def _table(values: dict[str, list], errors: list[str | None], schema: pa.Schema) -> pa.Table:
    columns = [pa.array(values[f.name], type=f.type) for f in schema]
    return pa.Table.from_arrays([*columns, pa.array(errors, pa.string())], names=[*schema.names, READ_ERROR])


def _typed(value, field: pa.Field):
    """`value` as `field`'s type, or a ValueError naming the field."""
    if value is None:
        return None
    if pa.types.is_string(field.type):
        if isinstance(value, (bool, int, float)):  # a number named as text (or id) is its JSON text
            return json.dumps(value)
        if not isinstance(value, str):
            raise ValueError(f"{field.name!r} is a JSON {type(value).__name__}, not a string")
        return value
    try:
        return pa.array([value], type=field.type)[0].as_py()
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise ValueError(f"{field.name!r} value {value!r} is not {field.type}") from None


def _json_lines(data: bytes, schema: pa.Schema) -> tuple[dict[str, list], list[str | None]]:
    """Every non-blank line of a JSONL file (the rows Arrow's reader makes), each read on
    its own; an unreadable line keeps what of it parses."""
    values: dict[str, list] = {f.name: [] for f in schema}
    errors: list[str | None] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            error = None
        except ValueError as e:
            record, error = {}, f"line {number}: invalid JSON ({getattr(e, 'msg', e)})"
        for f in schema:
            try:
                value = _typed(record.get(f.name), f)
            except ValueError as e:
                value, error = None, error or f"line {number}: {e}"
            values[f.name].append(value)
        errors.append(error)
    return values, errors


def _check_json_keys(table: pa.Table, data: bytes, uri: str) -> None:
    """A column null in every row may be missing from the file: a mistyped column name
    then fails the file, naming the keys its first object has."""
    for name in table.column_names:
        if name == READ_ERROR or table.column(name).null_count < table.num_rows:
            continue
        for line in data.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                if name not in record:
                    raise _missing(uri, name, list(record))
                break


def _csv_header(data: bytes) -> list[str]:
    return next(csv.reader(io.StringIO(data.decode("utf-8", "replace"), newline="")), [])


def _csv_records(data: bytes, schema: pa.Schema) -> tuple[dict[str, list], list[str | None]]:
    """Every non-empty record of a CSV file after its header (the rows Arrow's reader
    makes), each converted on its own as Arrow's reader converts them."""
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape", newline="")
    reader = csv.reader(text)
    header = next(reader)
    where = {name: header.index(name) for name in schema.names}
    nulls = set(pacsv.ConvertOptions().null_values)
    values: dict[str, list] = {f.name: [] for f in schema}
    errors: list[str | None] = []
    line = reader.line_num
    for record in reader:
        number, line = line + 1, reader.line_num
        if not record:
            continue
        error = None if len(record) == len(header) else f"line {number}: {len(record)} fields, the header has {len(header)}"
        for f in schema:
            raw = record[where[f.name]] if where[f.name] < len(record) else None
            try:
                value = _csv_value(raw, f, nulls)
            except ValueError as e:
                value, error = None, error or f"line {number}: {e}"
            values[f.name].append(value)
        errors.append(error)
    return values, errors


def _csv_value(raw: str | None, field: pa.Field, nulls: set[str]):
    """A CSV field as Arrow's reader converts it (strings as they are), or a ValueError."""
    if raw is None:
        return None
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field.name!r} is not valid UTF-8") from None
    if pa.types.is_string(field.type):
        return raw
    if raw in nulls:
        return None
    try:
        return pa.array([raw]).cast(field.type)[0].as_py()
    except pa.ArrowException:
        raise ValueError(f"{field.name!r} value {raw!r} is not {field.type}") from None


def _missing(uri: str, column: str, names: list[str]) -> InputError:
    return InputError(f"{uri}: no column {column!r}; the file has columns {names}")
def _check_columns(schema: pa.Schema, columns: list[str], uri: str) -> None:
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise _missing(uri, missing[0], schema.names)


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
    A line the reader could not read (`READ_ERROR`) is unusable with the reader's reason.
    """
    texts, reasons = _texts(table.column(column), column, uri)
    if READ_ERROR in table.column_names and table.column(READ_ERROR).null_count < table.num_rows:
        for row, error in enumerate(table.column(READ_ERROR).to_pylist()):
            if error is not None:
                texts[row], reasons[row] = None, error
    return texts, reasons


def _texts(col: pa.ChunkedArray, column: str, uri: str) -> tuple[list[str | None], list[str | None]]:
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

