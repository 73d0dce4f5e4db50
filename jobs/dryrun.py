"""`--dry-run`: what a job would do, from its plan and one load of the model, writing nothing.

Plans the units, runs the preflight checks, loads the model once (uncompiled, on the
job's device when this machine has it, else on the CPU: a cluster's head may have no GPU)
and reports units, rows, an estimate of tokens from a sample of the first
unit's rows, the output columns with their Arrow types (from the writer's own encoding)
and the model settings as resolved.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from jobs.plan import list_inputs, plan_units
from jobs.preflight import check_job, read_schema
from jobs.spec import JobSpec
from workers.reader import read_unit_parts, text_column
from workers.writer import output_columns

SAMPLE_ROWS = 1000


def describe_job(spec: JobSpec) -> str:
    import torch

    from states.runtime import Runtime

    files = list_inputs(spec)
    units = check_job(spec, files, plan_units(spec, files))
    known = [u.num_rows for u in units if u.num_rows >= 0]
    device = spec.device if torch.cuda.is_available() else "cpu"
    runtime = Runtime(dataclasses.replace(spec.model_options, compile="off", device=device))
    lines = [f"dry run: {plural(len(files), 'input file')}, {plural(len(units), 'unit')} -> {spec.output}",
             f"rows: {sum(known):,}" + (f" in {plural(len(known), 'unit')}; {plural(len(units) - len(known), 'unit')}"
                                         " of whole non-Parquet files are counted when read"
                                         if len(known) < len(units) else "")]
    per_row = _tokens_per_row(spec, units, runtime)
    if per_row is not None:
        lines.append(f"tokens: ~{per_row * sum(known):,.0f} ({per_row:,.1f} per row over a sample of the first unit, "
                     f"max_length {runtime.max_length})")
    lines.append("output columns: " + ", ".join(f"{name}: {kind}" for name, kind in _output_schema(spec, files, runtime)))
    lines.append(f"model (loaded on {runtime.device} for this dry run): "
                 + ", ".join(f"{k}={v}" for k, v in runtime.provenance().items() if v != ""))
    return "\n".join(lines)


def _tokens_per_row(spec: JobSpec, units: list, runtime) -> float | None:
    """Mean tokens per row (truncated as the job truncates) over the first unit's first rows."""
    if not units:
        return None
    try:
        part = next(read_unit_parts(units[0], [spec.text_column], spec.storage_options)).slice(0, SAMPLE_ROWS)
    except (StopIteration, ValueError, OSError):
        return None
    texts = [t for t in text_column(part, spec.text_column, units[0].uri)[0] if t is not None]
    if not texts:
        return None
    lengths = [len(ids) for ids in runtime.tokenizer(texts, add_special_tokens=True)["input_ids"]]
    return float(np.minimum(lengths, runtime.max_length).mean())


def _output_schema(spec: JobSpec, files: list, runtime) -> list[tuple[str, pa.DataType]]:
    """(name, type) of the shards' columns: the id column, then the task's columns as the writer encodes them."""
    if spec.id_column:
        schema = read_schema(files[0][0], files[0][1], spec.storage_options)
        columns = [(spec.id_column, schema.field(spec.id_column).type if spec.id_column in schema.names else "?")]
    else:
        columns = [("row_key", pa.string())]
    if spec.overlong == "chunk" and spec.chunk_aggregate == "none":
        columns.append(("chunk", pa.int32()))
    zeros = {name: (np.zeros((1, *shape), np.float32), np.ones(1, np.int64)) if name in runtime.ragged
             else np.zeros((1, *shape), np.float32) for name, shape in runtime.output_shapes.items()}
    encoded = output_columns(zeros, spec.output_dtype, runtime.labels)
    return columns + [(name, array.type) for name, array in encoded.items()]


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
