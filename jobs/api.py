"""The notebook API: `jobs.embed(df, model=...)`, `jobs.classify(...)`, `jobs.score(...)`.

A pandas DataFrame, polars DataFrame or pyarrow Table goes in; the same type comes back,
row-aligned with the input, with the task's columns added (`embedding`; `label`, `probs`,
`logits`; `score`, `logits`) and an `error` column: null where the row was computed, the
quarantine reason where it was not (its result columns are then null). Columns of the
same names are replaced, so results can be chained (`jobs.embed(jobs.classify(df, ...))`).

Underneath runs the CLI's job, unchanged: the text columns and a row-index id column are
staged as one Parquet file, `run_job` writes shards, and the shards and `_errors` are read
back and placed by row index. With `output=PATH` the shards stay there, exactly as the
CLI writes them, and a `pyarrow.dataset.Dataset` over them is returned; rerunning the
same call resumes (or finds the job done), since the staged file's name is derived from
its content and the output path.

Where the data is staged: every worker reads the staged file and, without `output=`,
writes its shards next to it. A local Ray (what `backend="auto"` starts when none is
connected) and `backend="local"` share this machine's disk, so a temp dir serves. The
workers of a cluster given by `address=`, or of a connected Ray with nodes on other
hosts, cannot see this machine's temp dir: pass `staging=` a URI every node and this
process can read and write (s3://, gs://, a shared mount; `storage_options` apply). The
staged files are removed when the call returns, Ctrl-C included.

Backends: `backend="auto"` runs the job in this process when that is the faster choice
(no Ray cluster named or connected, and CPU or one GPU), else on Ray; the driver prints
the choice and why.
On Ray it uses the connected Ray, else connects to `address=`, else starts a local Ray
(no dashboard, metrics off, token auth) and keeps it for later calls, as Ray Data does.

Warm workers: the loaded model outlives the call. Workers (in-process or Ray actors) stay
in this session's pool (`jobs.pool`), keyed by the options that shape the loaded model,
and the next call with the same model and options reuses them: it pays for its own rows,
not for a model load, compile and warm-up. They are released after
`jobs.pool.IDLE_SECONDS` idle (env `POOLJOBS_IDLE_SECONDS`), when a call needs another
model, at `jobs.shutdown()` (which also stops a Ray that pooljobs started) and at exit.
Ctrl-C raises KeyboardInterrupt after the driver has closed the call's workers; an
`output=` directory keeps its committed shards and resumes on the next call.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.manifest import DATA_DIR, ERRORS_DIR
from jobs.spec import JobSpec, SpecError
from workers import storage
from workers.reader import InputError
from workers.writer import put_atomic

ROW = "row_index"  # the staged id column: each row's position in `data`
TASK_COLUMNS = {"embed": ("embedding",), "classify": ("label", "probs", "logits"), "score": ("score", "logits")}
# Columns the job writes only when its outputs include them (sparse, multivector).
OPTIONAL_COLUMNS = ("sparse_indices", "sparse_values", "multivector")
SET_BY_API = ("input", "output", "model", "task", "text_column", "pair_column", "input_format", "backend", "address")


class JobFailedError(RuntimeError):
    """Some units failed after retries (or at once, on errors about their data); `outcome` holds the report."""

    def __init__(self, outcome) -> None:
        failed = "; ".join(f"{f['unit']}: {f['error']}" for f in outcome.report["units_failed"])
        super().__init__(f"{len(outcome.failed)} of {outcome.report['units']} units failed: {failed}")
        self.outcome = outcome


def shutdown() -> None:
    """Release this session's warm workers and stop the local Ray pooljobs started."""
    from jobs import pool

    pool.shutdown()


def embed(data, model, *, text_column: str = "text", output: str | None = None, backend: str = "auto",
          address: str | None = None, staging: str | None = None, **options: Any):
    """`data` with an `embedding` column (fixed-size list of the output dtype) and `error`.

    `options` are `JobSpec` fields (pooling, normalize, dim, output_dtype, max_length,
    device, num_workers, ...), validated as the CLI validates them; `progress=True` shows a
    tqdm bar (a notebook widget where ipywidgets is installed).
    """
    return _run("embed", data, model, text_column, None, output, backend, address, staging, options)


def classify(data, model, *, text_column: str = "text", output: str | None = None, backend: str = "auto",
             address: str | None = None, staging: str | None = None, **options: Any):
    """`data` with `label` (the config's id2label name, else the class index), `probs`,
    `logits` and `error` columns. `options` as for `embed`."""
    return _run("classify", data, model, text_column, None, output, backend, address, staging, options)


def score(data, model, *, pair_column: str, text_column: str = "text", output: str | None = None,
          backend: str = "auto", address: str | None = None, staging: str | None = None, **options: Any):
    """`data` with the cross-encoder's `score` (sigmoid of its one logit) for each
    (`text_column`, `pair_column`) pair, `logits` and `error`. `options` as for `embed`."""
    return _run("score", data, model, text_column, pair_column, output, backend, address, staging, options)


def _run(task: str, data, model, text_column: str, pair_column: str | None, output: str | None, backend: str,
        address: str | None, staging: str | None, options: dict):
    """Stage `data`, run the job, and return the results in `data`'s type (or, with
    `output`, a dataset over the shards)."""
    from jobs.driver import run_job

    kind = _kind(data)
    output, staging = (None if v is None else str(v) for v in (output, staging))
    for name in SET_BY_API:
        if name in options:
            raise SpecError(f"{name} is set by jobs.{task}(...), not an option here")
    if options.get("id_column") and output is None:
        raise SpecError("id_column names the shards' key column, so it needs output=; "
                        "without it the result is row-aligned with data")
    values = {**options, "id_column": options.get("id_column") or ROW, "model": str(model),
              "task": task, "text_column": text_column, "pair_column": pair_column, "backend": backend,
              "address": address, "input": "<data>", "output": output or "<staging>"}
    spec = JobSpec.from_mapping(values, "options")  # the CLI's validation, before any work
    if spec.overlong == "chunk" and spec.chunk_aggregate == "none" and output is None:
        raise SpecError("chunk_aggregate='none' writes one row per window, which a row-aligned result cannot "
                        "hold: pass output= (or use chunk_aggregate='mean')")
    if ROW in (text_column, pair_column):
        raise SpecError(f"{ROW!r} is the row index jobs.{task} adds; rename that text column")
    table = _staged_columns(data, kind, [c for c in (text_column, pair_column, spec.id_column) if c])
    from jobs.driver import choose_backend

    backend, _ = choose_backend(spec)
    if backend == "ray":
        _connect(spec.address, staging)

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=spec.unit_rows)  # row groups are what units split at
    staged = sink.getvalue()
    # With output=, the same data and output give the same staged URI, so a rerun resumes.
    if output:
        content = hashlib.sha256(memoryview(staged)).hexdigest()
        key = hashlib.sha256(f"{output}\n{content}".encode()).hexdigest()[:16]
    else:
        key = uuid.uuid4().hex
    root = storage.join(staging or tempfile.gettempdir(), f"pooljobs-{key}")
    spec = spec.replace(input=storage.join(root, "input.parquet"), output=output or storage.join(root, "output"))
    try:
        put_atomic(spec.input, staged, spec.storage_options)
        fs, path = storage.resolve(spec.input, spec.storage_options)
        if output and storage.is_local(fs):  # named by its content: a fixed mtime keeps the input's fingerprint
            os.utime(path, ns=(0, 0))
        outcome = run_job(spec, keep_workers=True)
        if not outcome.ok:
            raise JobFailedError(outcome)
        fs, path = storage.resolve(spec.output, spec.storage_options)
        if output is not None:
            import pyarrow.dataset as ds

            return ds.dataset(_parts(fs, path), filesystem=fs, format="parquet")
        return _attach(data, kind, _results(fs, path, task, table.num_rows))
    finally:
        fs, path = storage.resolve(root, spec.storage_options)
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            fs.delete_dir(path)


def _kind(data) -> str:
    if isinstance(data, pa.Table):
        return "arrow"
    for kind in ("pandas", "polars"):
        module = sys.modules.get(kind)  # never imported here just to check a type
        if module is not None and isinstance(data, module.DataFrame):
            return kind
    raise TypeError(f"data is a {type(data).__module__}.{type(data).__name__}; "
                    "pass a pandas DataFrame, a polars DataFrame or a pyarrow Table")


def _staged_columns(data, kind: str, columns: list[str]) -> pa.Table:
    """The columns the job reads, as Arrow; `ROW` (when among them) is the row index."""
    names = list(data.columns) if kind != "arrow" else data.column_names
    wanted = [c for c in dict.fromkeys(columns) if c != ROW]
    for name in wanted:
        if name not in names:
            raise InputError(f"data has no column {name!r}; its columns are {names}")
    if kind == "pandas":
        try:
            table = pa.Table.from_pandas(data[wanted], preserve_index=False)
        except (pa.ArrowException, ValueError) as e:
            raise InputError(f"cannot convert columns {wanted} of data to Arrow: {e}") from e
    elif kind == "polars":
        table = data.select(wanted).to_arrow()
    else:
        table = data.select(wanted)
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type):  # an all-None column: every row is quarantined as null text
            table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
        elif pa.types.is_string_view(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.large_string()))
    if ROW in columns:
        table = table.append_column(ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def _connect(address: str | None, staging: str | None) -> None:
    """Connect to (or start) Ray; refuse a local temp dir that workers on other hosts cannot read."""
    import ray

    from jobs.driver import init_ray

    if staging is None and address and address != "local":
        raise SpecError(f"address={address!r}: the cluster's workers cannot read this machine's temp dir; "
                        "pass staging= a URI they all reach (s3://bucket/tmp, gs://..., a shared mount)")
    init_ray(address)  # a Ray it starts stays up for the next call; ray.shutdown() stops it
    here = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n["Alive"]]
    hosts = {n["NodeManagerAddress"] for n in nodes}
    if staging is None and hosts != {n["NodeManagerAddress"] for n in nodes if n["NodeID"] == here}:
        raise SpecError(f"the connected Ray has nodes on {len(hosts)} hosts, which cannot read this machine's "
                        "temp dir; pass staging= a URI they all reach (s3://bucket/tmp, gs://..., a shared mount)")


def _parts(fs: pafs.FileSystem, path: str, sub: str = DATA_DIR) -> list[str]:
    """Paths of the `part-*.parquet` files in `path`'s `sub` folder (the shards'), in name order."""
    entries = storage.list_dir(fs, storage.join(path, sub))
    return [e.path for e in entries if e.is_file and e.base_name.startswith("part-") and e.base_name.endswith(".parquet")]


def _read(fs: pafs.FileSystem, paths: list[str]) -> pa.Table | None:
    tables = [pq.read_table(p, filesystem=fs).replace_schema_metadata(None) for p in paths]
    return pa.concat_tables(tables) if tables else None


def _results(fs: pafs.FileSystem, path: str, task: str, n: int) -> dict[str, pa.ChunkedArray]:
    """The task's columns and `error`, each of length `n`, in input order."""
    shards, errors = _read(fs, _parts(fs, path)), _read(fs, _parts(fs, path, ERRORS_DIR))
    position = np.full(n, -1, dtype=np.int64)  # row -> its row in `shards`
    if shards is not None:
        ids = shards.column(ROW).to_numpy()
        assert len(np.unique(ids)) == len(ids), "one output row per input row (checked in _run)"
        position[ids] = np.arange(shards.num_rows)
    reasons = np.full(n, None, dtype=object)
    quarantined = np.zeros(n, dtype=bool)
    if errors is not None:
        rows = errors.column(ROW).to_numpy()
        reasons[rows], quarantined[rows] = errors.column("reason").to_numpy(zero_copy_only=False), True
    assert ((position >= 0) ^ quarantined).all(), "every row is either computed or quarantined"
    take = pa.array(position, mask=position < 0)
    columns = {}
    present = [c for c in OPTIONAL_COLUMNS if shards is not None and c in shards.column_names]
    wanted = [c for c in TASK_COLUMNS[task] if not present or shards is None or c in shards.column_names]
    for name in wanted + present:
        if shards is not None and name in shards.column_names:
            columns[name] = shards.column(name).take(take)
        else:
            columns[name] = pa.chunked_array([pa.nulls(n)])
    columns["error"] = pa.chunked_array([pa.array(reasons, type=pa.string())])
    return columns


def _attach(data, kind: str, columns: dict[str, pa.ChunkedArray]):
    """`data` with `columns` added (same names replaced), in `data`'s own type."""
    if kind == "pandas":
        series = {}
        for name, col in columns.items():
            s = col.to_pandas()
            s.index = data.index
            series[name] = s
        return data.assign(**series)
    if kind == "polars":
        import polars as pl

        return data.with_columns(pl.from_arrow(pa.table(columns)).get_columns())
    for name, col in columns.items():
        i = data.schema.get_field_index(name)
        data = data.set_column(i, name, col) if i >= 0 else data.append_column(name, col)
    return data
