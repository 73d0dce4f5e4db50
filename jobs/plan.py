"""Planning: input files -> work units with stable names.

Units are derived only from the sorted input listing and Parquet row-group layout, so
the same input always yields the same units and shard names; that is what makes resume
and exactly-once output checkable. Only metadata is read here.
"""

from __future__ import annotations

import fnmatch
import hashlib

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.spec import JobSpec
from workers import storage
from workers.reader import DATASET_FORMAT, FORMAT_OF_SUFFIX, InputError, Unit, check_text_types


def _uri(original: str, path: str) -> str:
    scheme = storage.remote_scheme(original)
    return storage.uri(scheme, path) if scheme else path


def _format(path: str, forced: str) -> str | None:
    if forced != "auto":
        return forced
    suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    return FORMAT_OF_SUFFIX.get(suffix)


def list_inputs(spec: JobSpec) -> list[tuple[str, str, int]]:
    """(uri, format, size) of every input file, sorted; raises InputError when a named
    input does not exist or holds no readable file."""
    found: dict[str, tuple[str, int]] = {}
    for entry in spec.inputs:
        has_glob = any(ch in entry for ch in "*?[")
        base = entry.split("*")[0].rsplit("/", 1)[0] if has_glob else entry
        fs, path = storage.resolve(base, spec.storage_options)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"input {entry} does not exist")
        if info.type == pafs.FileType.File:
            candidates = [info]
        else:
            candidates = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.is_file]
        pattern = storage.resolve(entry, spec.storage_options)[1] if has_glob else None
        for item in candidates:
            name = item.path.rsplit("/", 1)[-1]
            if name.startswith((".", "_")) or (pattern and not fnmatch.fnmatch(item.path, pattern)):
                continue
            fmt = _format(item.path, spec.input_format)
            if fmt is None:
                if info.type == pafs.FileType.File:
                    raise InputError(f"{entry}: cannot tell the format from the extension; pass --input-format")
                continue
            found[_uri(entry, item.path)] = (fmt, item.size)
    if not found:
        raise InputError(f"no input files found in {spec.inputs} (looked for {sorted(set(FORMAT_OF_SUFFIX))})")
    return [(uri, fmt, size) for uri, (fmt, size) in sorted(found.items())]


def _layout(uri: str, fmt: str, options: dict) -> tuple[pa.Schema, list[int] | None]:
    """(schema, rows per row group), the latter None for formats without row groups."""
    fs, path = storage.resolve(uri, options)
    if fmt == "parquet":
        with fs.open_input_file(path) as fh:
            meta = pq.ParquetFile(fh).metadata
        return meta.schema.to_arrow_schema(), [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return ds.dataset(path, format=DATASET_FORMAT[fmt], filesystem=fs).schema, None


def plan_units(spec: JobSpec, files: list[tuple[str, str, int]]) -> list[Unit]:
    """Parquet files split at row-group boundaries into units of about `unit_rows`; other
    formats are one unit per file. A text column of a non-text type fails here, before any
    model loads; an unreadable file becomes one unit whose worker reports the error, so it
    is recorded as failed with the rest of the job still done. Zero-row files plan no unit."""
    text_columns = [c for c in (spec.text_column, spec.pair_column) if c]
    units = []
    for f_idx, (uri, fmt, _) in enumerate(files):
        whole = Unit(f"part-{f_idx:05d}-00000", uri, fmt, 0, -1)
        try:
            schema, row_groups = _layout(uri, fmt, spec.storage_options)
        except (OSError, pa.ArrowException):
            units.append(whole)
            continue
        check_text_types(schema, text_columns, uri)
        if row_groups is None:
            units.append(whole)
            continue
        spans: list[tuple[int, int, list[int]]] = []  # (first row, rows, row groups)
        offset = 0
        for rg, n in enumerate(row_groups):
            if n == 0:
                continue
            if not spans or spans[-1][1] + n > spec.unit_rows:
                spans.append((offset, 0, []))
            first, rows, groups = spans[-1]
            spans[-1] = (first, rows + n, groups + [rg])
            offset += n
        units += [Unit(f"part-{f_idx:05d}-{u:05d}", uri, fmt, first, rows, tuple(groups))
                  for u, (first, rows, groups) in enumerate(spans)]
    return units


def input_fingerprint(files: list[tuple[str, str, int]]) -> str:
    """sha256 of the listing (names, formats, sizes): a resume must see the same input."""
    return hashlib.sha256(repr(files).encode()).hexdigest()
