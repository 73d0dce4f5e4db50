"""Exact count of repeated keys over more keys than fit in memory (`jobs.verify` at 10^9 rows).

Keys are buffered up to `run_keys`, sorted (Arrow's sort) and spilled to a temporary
Arrow IPC file in batches of `BATCH_KEYS`: a run, of which only each batch's first key
stays in memory. `result` then cuts the key space into ranges of about `run_keys` keys,
at splitters sampled from the runs, and counts each range from the batches of every run
that overlap it (read from disk, filtered to the range): repeats in a range are its keys
less its distinct keys. Memory holds one buffer or one range at a time (plus a first key
per batch), whatever the number of keys; the answer is exact (no hashing, no false
positives).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
import os
import shutil
import tempfile
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

RUN_KEYS = 4_000_000  # keys held in memory: one buffer while adding, about one range while counting
BATCH_KEYS = 1 << 13  # keys per batch of a run, the unit read back: a range takes ~RUN_KEYS / runs of each run


@dataclass
class _Run:
    path: str
    firsts: list  # each batch's first key (the run is sorted)


class KeyTally:
    """`add` keys (any sortable Arrow type, one type per tally); `result` gives how many
    keys repeat an earlier one (a key seen n times counts n - 1) and one repeated key."""

    def __init__(self, run_keys: int = RUN_KEYS, directory: str | None = None) -> None:
        self.run_keys = run_keys
        self._dir = tempfile.mkdtemp(prefix="pooljobs-tally-", dir=directory)
        self._buffer: list[pa.Array] = []
        self._buffered = 0
        self._runs: list[_Run] = []
        self._type: pa.DataType | None = None
        self.keys = 0
        self._nulls = 0

    def add(self, keys: pa.Array | pa.ChunkedArray) -> None:
        """Count `keys`; raises TypeError when their type is not the first keys' type."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks() if keys.num_chunks else pa.array([], keys.type)
        if pa.types.is_dictionary(keys.type):
            keys = keys.dictionary_decode()
        self._type = self._type or keys.type
        if keys.type != self._type:
            raise TypeError(f"keys of type {keys.type} after keys of type {self._type}")
        self.keys += len(keys)
        self._nulls += keys.null_count
        keys = pc.drop_null(keys)
        self._buffer.append(keys)
        self._buffered += len(keys)
        if self._buffered >= self.run_keys:
            self._spill()

    def _spill(self) -> None:
        if not self._buffered:
            return
        keys = pa.concat_arrays(self._buffer)
        self._buffer, self._buffered = [], 0
        keys = keys.take(pc.sort_indices(keys))
        run = _Run(os.path.join(self._dir, f"run-{len(self._runs):06d}.arrow"), [])
        schema = pa.schema([("k", keys.type)])
        with pa.OSFile(run.path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for start in range(0, len(keys), BATCH_KEYS):
                batch = keys.slice(start, BATCH_KEYS)
                run.firsts.append(batch[0].as_py())
                writer.write_batch(pa.record_batch([batch], schema=schema))
        self._runs.append(run)

    def result(self) -> tuple[int, Any]:
        """(repeats, a repeated key or None)."""
        repeats, example = max(0, self._nulls - 1), None
        if not self._runs:  # everything fitted: one range, in memory
            return self._count(pa.chunked_array(self._buffer, self._type or pa.null()), repeats, example)
        self._spill()
        firsts = sorted(first for run in self._runs for first in run.firsts)  # splitter candidates
        ranges = max(1, math.ceil(self.keys / self.run_keys))
        splitters = sorted({firsts[len(firsts) * i // ranges] for i in range(1, ranges)})
        bounds = [None, *splitters, None]  # [low, high) per range; None: unbounded
        for low, high in zip(bounds, bounds[1:]):
            pieces = [piece for run in self._runs for piece in self._slice(run, low, high)]
            repeats, example = self._count(pa.chunked_array(pieces, self._type), repeats, example)
        return repeats, example

    def _slice(self, run: _Run, low: Any, high: Any) -> list[pa.Array]:
        """The run's keys in [low, high), reading only the batches that may hold them."""
        first = 0 if low is None else max(0, bisect.bisect_left(run.firsts, low) - 1)
        end = len(run.firsts) if high is None else bisect.bisect_left(run.firsts, high)
        pieces = []
        with pa.OSFile(run.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(first, end):
                keys = reader.get_batch(i).column(0)
                if low is not None:
                    keys = keys.filter(pc.greater_equal(keys, pa.scalar(low, self._type)))
                if high is not None:
                    keys = keys.filter(pc.less(keys, pa.scalar(high, self._type)))
                pieces.append(keys)
        return pieces

    @staticmethod
    def _count(keys: pa.ChunkedArray, repeats: int, example: Any) -> tuple[int, Any]:
        distinct = pc.count_distinct(keys).as_py()
        if distinct < len(keys) and example is None:
            counts = pc.value_counts(keys)
            example = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        return repeats + len(keys) - distinct, example

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> KeyTally:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
