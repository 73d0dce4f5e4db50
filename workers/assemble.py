"""Output assembly: packs' rows and outputs back in input order, as a shard's row group;
and the quarantine table of rows that could not be processed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from states import ragged
from states.pooling import mean_of_windows
from workers.dedup import HASH_COLUMN
from workers.options import UnitOptions
from workers.reader import Unit
from workers.writer import output_columns


Output = np.ndarray | tuple[np.ndarray, np.ndarray]  # (N, ...), or a ragged output's (values, lengths)


def in_input_order(rows: list[np.ndarray], chunks: list[np.ndarray], outputs: dict[str, Output],
                   options: UnitOptions, normalize: bool) -> tuple[np.ndarray, np.ndarray, dict[str, Output]]:
    """Per-pack (unit rows, chunk numbers) and the outputs in pack order -> all in input
    order (ragged outputs as (values, lengths)); with chunk_aggregate='mean', one row per text: the mean of its windows
    (`states.pooling.mean_of_windows`)."""
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), outputs
    rows, chunks = np.concatenate(rows), np.concatenate(chunks)
    order = np.lexsort((chunks, rows))
    outputs = {k: ragged.take(*v, order) if isinstance(v, tuple) else v[order] for k, v in outputs.items()}
    rows, chunks = rows[order], chunks[order]
    if options.overlong != "chunk" or options.chunk_aggregate == "none":
        return rows, chunks, outputs
    unique, starts = np.unique(rows, return_index=True)
    return unique, np.zeros(len(unique), np.int32), {"embedding": mean_of_windows(outputs["embedding"], starts, normalize)}


def part_values(chunks: np.ndarray, outputs: dict[str, Output], options: UnitOptions,
                labels: list[str] | None, ranges: np.ndarray | None) -> pa.Table:
    """Output rows in input order -> the columns after the key: chunk (when each window is
    its own row), the task's output columns."""
    columns = {}
    if options.overlong == "chunk" and options.chunk_aggregate == "none":
        columns["chunk"] = pa.array(chunks, type=pa.int32())
    return pa.table({**columns, **output_columns(outputs, options.output_dtype, labels, ranges)})


def shard_part(keys: tuple[str, pa.Array], hashes: pa.Array, rows: np.ndarray, values: pa.Table) -> pa.Table:
    """A row group: each output row's key, its `values`, its input's content hash (`rows`:
    the unit row of each output row)."""
    (key_name, key_values), take = keys, pa.array(rows, type=pa.int64())
    return pa.table({key_name: key_values.take(take), **dict(zip(values.column_names, values.columns)),
                     HASH_COLUMN: hashes.take(take)})


def errors_table(unit: Unit, keys: tuple[str, pa.Array], bad: dict[int, str]) -> pa.Table:
    """Quarantined rows: key, source file, row within it, and why."""
    rows = sorted(bad)
    key_name, key_values = keys
    where = unit.locate(rows[-1] + 1)
    return pa.table({
        key_name: key_values.take(pa.array(rows, type=pa.int64())),
        "file": pa.array([where[r][0] for r in rows]),
        "row": pa.array([where[r][1] for r in rows], type=pa.int64()),
        "reason": pa.array([bad[r] for r in rows]),
    })
