"""Checks before any worker starts: what the plan and the model's files can tell.

`check_job` runs in `run_job` after planning and before the output is claimed, so a
mistake costs neither a Ray start nor a model load, and leaves no `_job.json` behind that
would refuse the corrected rerun. Each failure is a ValueError subclass with one line
naming the option and the fix (the CLI prints it and exits 2):

- columns: the text, pair and id columns must exist in the input (a file lacking them
  while others have them fails only its own unit, as any unreadable file does);
- model: `states.preflight.check(ModelOptions)` compares `dim`, `max_length` and the task
  with the model's config and heads, when the models layer provides it;
- device: `device=cuda` needs a GPU where the workers run (this machine for the local
  backend or a local Ray; the cluster's GPUs, unless an autoscaler adds them, otherwise).

It also applies `--limit`: only the first units holding the first N rows run, the last one
cut to the Parquet row groups it needs.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from typing import Sequence

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from jobs.spec import JobSpec, SpecError, did_you_mean
from workers import storage
from workers.reader import DATASET_FORMAT, InputError, Unit


def check_job(spec: JobSpec, files: Sequence[tuple], units: list[Unit]) -> list[Unit]:
    """Raise on what would fail every unit; return the units to run (`spec.limit` applied).
    `files` are the planner's `(uri, format, ...)` listing in order."""
    check_columns(spec, files)
    check_model(spec)
    check_device(spec)
    return limit_units(units, spec.limit, spec.storage_options)


def read_schema(uri: str, fmt: str, storage_options: dict) -> pa.Schema:
    fs, path = storage.resolve(uri, storage_options)
    if fmt == "parquet":
        with fs.open_input_file(path) as f:
            return pq.read_schema(f)
    return ds.dataset(path, format=DATASET_FORMAT[fmt], filesystem=fs).schema


def check_columns(spec: JobSpec, files: Sequence[tuple]) -> None:
    """Pass at the first readable file holding every named column; raise when none does.
    Unreadable files are left to their units, which report them."""
    wanted = {"text_column": spec.text_column, "pair_column": spec.pair_column, "id_column": spec.id_column}
    wanted = {option: column for option, column in wanted.items() if column}
    first: tuple[str, pa.Schema] | None = None
    for uri, fmt, *_ in files:
        try:
            schema = read_schema(uri, fmt, spec.storage_options)
        except (OSError, pa.ArrowException):
            continue
        if all(column in schema.names for column in wanted.values()):
            return
        first = first or (uri, schema)
    if first is None:
        return
    uri, schema = first
    option, column = next((o, c) for o, c in wanted.items() if c not in schema.names)
    raise InputError(f"{option}={column!r}: no input file has this column ({uri} has {schema.names})"
                     f"{did_you_mean(column, schema.names)}")


def check_model(spec: JobSpec) -> None:
    """The models layer's own check of the options against the model's files, when present."""
    if importlib.util.find_spec("states.preflight") is not None:
        importlib.import_module("states.preflight").check(spec.model_options)


class DeviceError(SpecError):
    """The device asked for is not where the workers would run."""


def check_device(spec: JobSpec) -> None:
    if not spec.device.startswith("cuda"):
        return
    if spec.backend == "local" or not _ray_known(spec):
        _check_local_gpu(spec.device, "this machine" if spec.backend == "local" else "this machine (a local Ray)")
        return
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus == 0 and not _autoscaling():
        raise DeviceError(f"device={spec.device!r}, but the Ray cluster has no GPU and no autoscaler to add one "
                          f"(its resources: {_resources()}); start GPU nodes, or pass --device cpu")


def _check_local_gpu(device: str, where: str) -> None:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        raise DeviceError(f"device={device!r}, but {where} has no CUDA GPU; pass --device cpu (or auto), "
                          "or run on a GPU host")
    if index >= count:
        raise DeviceError(f"device={device!r}, but {where} has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")


def _ray_known(spec: JobSpec) -> bool:
    """Whether the workers run on a Ray cluster this process is connected to, connecting
    when an address (or RAY_ADDRESS, as `ray job submit` sets) names one; the driver then
    finds the connection made. A local Ray the driver would start has this machine's GPUs,
    which are checked without starting it (nor importing Ray: a connection needs it imported)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return True
    address = spec.address or os.environ.get("RAY_ADDRESS")
    if not address or address == "local":
        return False
    from jobs.driver import init_ray

    init_ray(address)
    return True


def _resources() -> str:
    import ray

    return ", ".join(f"{v:g} {k}" for k, v in sorted(ray.cluster_resources().items()) if k in ("CPU", "GPU"))


def _autoscaling() -> bool:
    """Whether an autoscaler with node types of its own (a `ray up` cluster) runs. Its
    monitor reports to the GCS key `ray status` reads; a head started by hand has a
    read-only one whose node types are the nodes themselves, named `node_<id>`."""
    from ray.experimental.internal_kv import _internal_kv_get

    status = _internal_kv_get("__autoscaling_status")
    report = json.loads(status).get("autoscaler_report") if status else None
    return bool(report) and any(not kind.startswith("node_") for kind in report.get("active_nodes", {}))


def limit_units(units: list[Unit], limit: int | None, storage_options: dict) -> list[Unit]:
    """The first units that together hold at least `limit` rows (all of them without a
    limit), the last one cut to the Parquet row groups it needs. A unit of unknown size
    (a whole non-Parquet file) ends the selection."""
    if limit is None:
        return units
    kept, rows = [], 0
    for unit in units:
        if rows >= limit:
            break
        if unit.row_groups and rows + unit.num_rows > limit:
            unit = _first_rows(unit, limit - rows, storage_options)
        kept.append(unit)
        rows += unit.num_rows if unit.num_rows >= 0 else limit
    return kept


def _first_rows(unit: Unit, rows: int, storage_options: dict) -> Unit:
    """`unit` cut to its first files (a unit of small files) and, in the last one kept, its
    first row groups, holding at least `rows` rows."""
    pieces, held = [], 0
    for piece in unit.files():
        if held >= rows:
            break
        if held + piece.num_rows > rows:
            piece = _first_row_groups(piece, rows - held, storage_options)
        pieces.append(piece)
        held += piece.num_rows
    return dataclasses.replace(pieces[0], num_rows=held, segments=tuple(pieces[1:]))


def _first_row_groups(unit: Unit, rows: int, storage_options: dict) -> Unit:
    """`unit` cut to its first row groups holding at least `rows` rows."""
    fs, path = storage.resolve(unit.uri, storage_options)
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    groups, held = [], 0
    for group in unit.row_groups:
        if held >= rows:
            break
        groups.append(group)
        held += meta.row_group(group).num_rows
    return dataclasses.replace(unit, num_rows=held, row_groups=tuple(groups))
