"""Planning: input files -> work units with stable names.

Units are derived only from the sorted input listing and Parquet row-group layout, so
the same input always yields the same units and shard names; that is what makes resume
and exactly-once output checkable. Only metadata is read here.
"""

from __future__ import annotations

import fnmatch
import hashlib
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.spec import JobSpec
from workers import storage
from workers.reader import FORMAT_OF_SUFFIX, InputError, Unit


def _uri(original: str, path: str) -> str:
    scheme = urlparse(original).scheme
    return storage.uri(scheme, path) if scheme and len(scheme) > 1 else path


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


def plan_units(spec: JobSpec, files: list[tuple[str, str, int]]) -> list[Unit]:
    """Parquet files split at row-group boundaries into units of about `unit_rows`;
    other formats are one unit per file."""
    units = []
    for f_idx, (uri, fmt, _) in enumerate(files):
        if fmt != "parquet":
            units.append(Unit(f"part-{f_idx:05d}-00000", uri, fmt, 0, -1))
            continue
        fs, path = storage.resolve(uri, spec.storage_options)
        try:
            with fs.open_input_file(path) as fh:
                meta = pq.ParquetFile(fh).metadata
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"cannot read {uri} as Parquet: {e}") from e
        spans: list[tuple[int, int, list[int]]] = []  # (first row, rows, row groups)
        offset = 0
        for rg in range(meta.num_row_groups):
            n = meta.row_group(rg).num_rows
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
