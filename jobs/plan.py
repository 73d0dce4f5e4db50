"""Planning: input files -> work units with stable names.

Units are derived only from the sorted input listing and Parquet row-group layout, so
the same input always yields the same units and shard names; that is what makes resume
and exactly-once output checkable. Only metadata is read here, footers in parallel
through one filesystem object per store.

The listing follows symbolic links but reads each real file once: a directory reached a
second time (a symlink loop, or a second link to it) and a file seen under another name
are skipped and logged. Names starting with "." or "_" (hidden files, other jobs' side
files) and everything under the job's own output directory are not input.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import json
import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.json as pajson
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.manifest import Manifest
from jobs.spec import JobSpec
from workers import storage
from workers.reader import DATASET_FORMAT, FORMAT_OF_SUFFIX, TEXT_FORMATS, InputError, Unit, check_text_types

log = logging.getLogger("pooljobs")
READERS = 32  # object stores: footers read at once (planning waits on latency, not CPU)
LOCAL_READERS = 2  # local disks: footers are CPU work once cached
CHUNK = 64  # files per task: a future per file costs as much as reading a cached footer
HEAD_BYTES = 1 << 16  # what of the first JSONL/CSV file the id type is inferred from
PARQUET = ds.ParquetFileFormat()
PLAN_VERSION = 1  # bump when planning changes what units a listing gives: saved plans then miss
PLANNING_OPTIONS = ("input_format", "unit_rows", "text_column", "pair_column", "id_column")
NAME_DIGITS = 5  # unit names' minimum digits; more when the listing needs them, so names sort in input order


class InputFile(NamedTuple):
    uri: str
    format: str
    size: int
    version: str  # what changes when the content does: mtime in ns (local disks and object stores)


def _uri(original: str, path: str) -> str:
    scheme = storage.remote_scheme(original)
    return storage.uri(scheme, path) if scheme else path


def _format(path: str, forced: str) -> str | None:
    if forced != "auto":
        return forced
    suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    return FORMAT_OF_SUFFIX.get(suffix)


def _hidden(path: str, base: str) -> bool:
    """A name below `base` starting with "." or "_" (as pyarrow datasets skip them)."""
    return any(part.startswith((".", "_")) for part in path[len(base):].split("/") if part)


def _under(path: str, directory: str | None) -> bool:
    return directory is not None and (path == directory or path.startswith(directory.rstrip("/") + "/"))


def _local_files(root: str, exclude: str | None) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of the files below `root`, links followed, each real
    directory and file once (in sorted walk order: the first name wins)."""
    seen_dirs: dict[tuple[int, int], str] = {}
    seen_files: dict[tuple[int, int], str] = {}
    found = []
    for directory, subdirs, names in os.walk(root, followlinks=True):
        st = os.stat(directory)
        first = seen_dirs.setdefault((st.st_dev, st.st_ino), directory)
        if first != directory:
            log.warning("input: skipped %s: the same directory as %s (a symlink loop or a second link)", directory, first)
            subdirs[:] = []
            continue
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_"))
                            and not _under(os.path.realpath(os.path.join(directory, d)), exclude))
        for name in sorted(names):
            path = os.path.join(directory, name)
            if name.startswith((".", "_")):
                continue
            try:
                st = os.stat(path)
            except OSError as e:
                log.warning("input: skipped %s: %s", path, e.strerror or e)
                continue
            first = seen_files.setdefault((st.st_dev, st.st_ino), path)
            if first != path:
                log.warning("input: skipped %s: the same file as %s", path, first)
                continue
            found.append((path, st.st_size, st.st_mtime_ns))
    return found


def _output_path(spec: JobSpec) -> str | None:
    """The output directory as the input listing sees it (local: its real path)."""
    if storage.remote_scheme(spec.output):
        return storage.resolve(spec.output, spec.storage_options)[1]
    return os.path.realpath(spec.output)


def list_inputs(spec: JobSpec) -> list[InputFile]:
    """Every input file, sorted by URI; raises InputError when a named input does not
    exist or holds no readable file."""
    found: dict[str, InputFile] = {}
    output = _output_path(spec)
    for entry in spec.inputs:
        has_glob = any(ch in entry for ch in "*?[")
        base = entry.split("*")[0].rsplit("/", 1)[0] if has_glob else entry
        fs, path = storage.resolve(base, spec.storage_options)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"input {entry} does not exist")
        pattern = storage.resolve(entry, spec.storage_options)[1] if has_glob else None
        if info.type == pafs.FileType.File:
            candidates = [(path, info.size, info.mtime_ns)]
        elif storage.is_local(fs):
            candidates = _local_files(path, output)
        else:
            candidates = [(i.path, i.size, i.mtime_ns) for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                          if i.is_file and not _hidden(i.path, path) and not _under(i.path, output)]
        for item, size, mtime in candidates:
            if pattern and not fnmatch.fnmatch(item, pattern):
                continue
            fmt = _format(item, spec.input_format)
            if fmt is None:
                if info.type == pafs.FileType.File:
                    raise InputError(f"{entry}: cannot tell the format from the extension; pass --input-format")
                continue
            uri = _uri(entry, item)
            found[uri] = InputFile(uri, fmt, size, str(mtime))
    if not found:
        raise InputError(f"no input files found in {spec.inputs} (looked for {sorted(set(FORMAT_OF_SUFFIX))})")
    return [found[uri] for uri in sorted(found)]


def _layout(fs: pafs.FileSystem, path: str, f: InputFile) -> tuple[pa.Schema, list[int] | None]:
    """(schema, rows per row group), the latter None for formats without row groups."""
    if f.format == "parquet":
        if storage.is_local(fs):
            meta = pq.read_metadata(path, filesystem=fs)
        else:  # the listing's size spares a HEAD request: the footer is one ranged GET
            fragment = PARQUET.make_fragment(path, filesystem=fs, file_size=f.size)
            fragment.ensure_complete_metadata()
            meta = fragment.metadata
        return meta.schema.to_arrow_schema(), [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    return ds.dataset(path, format=DATASET_FORMAT[f.format], filesystem=fs).schema, None


def _layouts(spec: JobSpec, files: list[InputFile]) -> list[tuple[pa.Schema, list[int] | None] | Exception | None]:
    """Each Parquet/IPC file's layout (or the error reading it), footers read in parallel
    through one filesystem object per store, in chunks of `CHUNK` files a task; JSONL/CSV
    files have none to read (they are read with the job's schema, `read_types`)."""
    filesystems = storage.FileSystems(spec.storage_options)

    def one(f: InputFile):
        if f.format in TEXT_FORMATS:
            return None
        try:
            fs, path = filesystems.resolve(f.uri)
            return _layout(fs, path, f)
        except (OSError, pa.ArrowException) as e:
            return e

    chunks = [files[i : i + CHUNK] for i in range(0, len(files), CHUNK)]
    local = all(not storage.remote_scheme(f.uri) for f in files)
    with ThreadPoolExecutor(min(LOCAL_READERS if local else READERS, max(1, len(chunks)))) as pool:
        return [layout for chunk in pool.map(lambda c: [one(f) for f in c], chunks) for layout in chunk]


def read_types(spec: JobSpec, first: InputFile, layout) -> pa.Schema:
    """The types JSONL/CSV columns are read as: text columns as strings, the id column as
    it is in the first input file (string when that cannot be told or lacks it)."""
    fields = [pa.field(c, pa.string()) for c in (spec.text_column, spec.pair_column) if c]
    if spec.id_column and spec.id_column not in (spec.text_column, spec.pair_column):
        try:
            schema = layout[0] if isinstance(layout, tuple) else _head_schema(first, spec.storage_options)
        except (OSError, pa.ArrowException):
            schema = pa.schema([])
        kind = schema.field(spec.id_column).type if spec.id_column in schema.names else pa.string()
        fields.append(pa.field(spec.id_column, kind.value_type if pa.types.is_dictionary(kind) else kind))
    return pa.schema(fields)


def _head_schema(f: InputFile, options: dict) -> pa.Schema:
    """The types Arrow infers from a JSONL/CSV file's first lines (its first 64 KiB, or
    its first record when those hold a bad line); an empty schema when it cannot tell."""
    fs, path = storage.resolve(f.uri, options)
    with fs.open_input_file(path) as fh:
        head = fh.read(HEAD_BYTES)
    lines = head.split(b"\n")[:-1] if len(head) == HEAD_BYTES else head.split(b"\n")
    lines = [line for line in lines if line.strip()]
    for take in (len(lines), 2 if f.format == "csv" else 1):
        try:
            data = io.BytesIO(b"\n".join(lines[:take]) + b"\n")
            return (pajson.read_json(data) if f.format == "jsonl" else pacsv.read_csv(data)).schema
        except pa.ArrowInvalid:
            continue
    return pa.schema([])


def _spans(row_groups: list[int], unit_rows: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """(first row, rows, row groups) of each unit: row groups gathered until the next
    would take a unit past `unit_rows`; empty row groups belong to none."""
    spans = []
    first = rows = offset = 0
    groups: list[int] = []
    for rg, n in enumerate(row_groups):
        if n == 0:
            continue
        if groups and rows + n > unit_rows:
            spans.append((first, rows, tuple(groups)))
            first, rows, groups = offset, 0, []
        groups.append(rg)
        rows += n
        offset += n
    if groups:
        spans.append((first, rows, tuple(groups)))
    return spans


def plan_units(spec: JobSpec, files: list[InputFile]) -> list[Unit]:
    """Parquet files split at row-group boundaries into units of about `unit_rows`; other
    formats are one unit per file. Consecutive Parquet files smaller than a unit (and of
    one schema) share a unit, up to `unit_rows`, named after the first. A text column of
    a non-text type in a Parquet or IPC file fails here, before any model loads; an
    unreadable file becomes one unit whose worker reports the error, so it is recorded as
    failed with the rest of the job still done. Zero-row files (zero-byte JSONL/CSV
    included) plan no unit."""
    text_columns = [c for c in (spec.text_column, spec.pair_column) if c]
    layouts = _layouts(spec, files)
    types = read_types(spec, files[0], layouts[0]) if files else None
    planned: list[list[tuple[int, int, tuple[int, ...]]] | None] = []  # per file; None: the whole file
    checked: pa.Schema | None = None  # the last schema whose text columns passed (files mostly share one)

    def check(schema: pa.Schema, uri: str) -> None:
        nonlocal checked
        if checked is None or not schema.equals(checked):
            check_text_types(schema, text_columns, uri)
            checked = schema

    for f, layout in zip(files, layouts):
        if f.format in TEXT_FORMATS:
            planned.append([] if f.size == 0 else None)
        elif isinstance(layout, Exception) or layout[1] is None:
            if not isinstance(layout, Exception):
                check(layout[0], f.uri)
            planned.append(None)
        else:
            check(layout[0], f.uri)
            planned.append(_spans(layout[1], spec.unit_rows))
    file_digits = max(NAME_DIGITS, len(str(len(files) - 1)))
    unit_digits = max([NAME_DIGITS] + [len(str(len(p) - 1)) for p in planned if p])

    def small(i: int) -> bool:  # a whole Parquet file of fewer rows than a unit
        spans = planned[i]
        return files[i].format == "parquet" and spans is not None and len(spans) == 1 and spans[0][1] < spec.unit_rows

    units = []
    i = 0
    while i < len(files):
        f, spans = files[i], planned[i]
        name = f"part-{i:0{file_digits}d}-{0:0{unit_digits}d}"
        if spans is None:
            units.append(Unit(name, f.uri, f.format, 0, -1, schema=types if f.format in TEXT_FORMATS else None))
            i += 1
            continue
        group, rows = [i], spans[0][1] if spans else 0
        while small(i) and group[-1] + 1 < len(files) and small(group[-1] + 1) \
                and layouts[group[-1] + 1][0].equals(layouts[i][0]) and rows + planned[group[-1] + 1][0][1] <= spec.unit_rows:
            group.append(group[-1] + 1)
            rows += planned[group[-1]][0][1]
        if len(group) > 1:  # small files share a unit: per-unit costs are paid once for them all
            segments = tuple(Unit("", files[k].uri, "parquet", 0, planned[k][0][1], planned[k][0][2]) for k in group[1:])
            units.append(Unit(name, f.uri, "parquet", 0, rows, spans[0][2], segments=segments))
        else:
            units += [Unit(f"part-{i:0{file_digits}d}-{u:0{unit_digits}d}", f.uri, f.format, first, n, groups)
                      for u, (first, n, groups) in enumerate(spans)]
        i = group[-1] + 1
    return units


def input_fingerprint(files: list[InputFile]) -> str:
    """sha256 of the listing (names, formats, sizes, versions): a resume must see the same
    input, content included."""
    return hashlib.sha256(repr([tuple(f) for f in files]).encode()).hexdigest()


def plan_key(spec: JobSpec, files: list[InputFile]) -> str:
    """What a plan follows from: the listing (names, formats, sizes, versions) and the
    options planning reads. Equal keys plan equal units."""
    options = {name: getattr(spec, name) for name in PLANNING_OPTIONS}
    return hashlib.sha256(json.dumps([PLAN_VERSION, input_fingerprint(files), options]).encode()).hexdigest()


def encode_plan(key: str, units: list[Unit]) -> bytes:
    """`units` as compressed JSON under `key`; JSONL/CSV units share one read schema, kept once."""
    types = next((u.schema for u in units if u.schema is not None), None)

    def row(u: Unit) -> list:
        return [u.name, u.uri, u.format, u.row_offset, u.num_rows, list(u.row_groups),
                [[s.uri, s.num_rows, list(s.row_groups)] for s in u.segments]]

    body = {"key": key, "types": base64.b64encode(types.serialize().to_pybytes()).decode() if types else None,
            "units": [row(u) for u in units]}
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 1)


def decode_plan(data: bytes, key: str | None) -> list[Unit] | None:
    """The units `encode_plan` stored, or None when they were planned under another key
    (or the bytes are not a plan: it is only a cache, planning again is always right).
    `key=None` takes them whatever they were planned from (another job's plan)."""
    try:
        body = json.loads(zlib.decompress(data))
        if key is not None and body.get("key") != key:
            return None
        types = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(body["types"]))) if body["types"] else None
        return [Unit(name, uri, fmt, offset, rows, tuple(groups), types if fmt in TEXT_FORMATS else None,
                     tuple(Unit("", s_uri, "parquet", 0, s_rows, tuple(s_groups)) for s_uri, s_rows, s_groups in segments))
                for name, uri, fmt, offset, rows, groups, segments in body["units"]]
    except (zlib.error, ValueError, KeyError, TypeError, pa.ArrowException):
        log.warning("plan: the saved plan cannot be read; planning again")
        return None


def saved_or_planned(spec: JobSpec, files: list[InputFile], manifest: Manifest) -> tuple[list[Unit], bool]:
    """(units, reused): the plan saved in the output when the listing and the planning
    options are unchanged (no footer read), else `plan_units`. A resume over 100k files
    then costs one listing, not 100k footer reads."""
    data = manifest.saved_plan()
    units = decode_plan(data, plan_key(spec, files)) if data is not None else None
    return (units, True) if units is not None else (plan_units(spec, files), False)


def save_plan(manifest: Manifest, spec: JobSpec, files: list[InputFile], units: list[Unit]) -> None:
    """Store the plan with the job (after `Manifest.prepare`), for `saved_or_planned`."""
    manifest.save_plan(encode_plan(plan_key(spec, files), units))
