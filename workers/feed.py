"""The read side of a unit: its parts read in order, their texts, content hashes and
unusable rows, and each window sent to the tokenizer as soon as its rows are read.

Windows are cut from the rows to compute only (`batching.WindowCutter`): usable rows
that are not copies of another (`workers.dedup`). They are the same whatever the parts,
so a rerun with the same copies tokenizes and packs the same rows together.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue

import numpy as np
import pyarrow as pa
from torch.profiler import record_function

from workers.batching import WindowCutter
from workers.dedup import UnitCopies, content_hashes
from workers.options import UnitOptions
from workers.reader import Unit, read_unit_parts, text_column
from workers.tokenize_pool import Pending, Tokenizing


@dataclass
class UnitInput:
    """What the reading of a unit leaves besides its windows."""

    keys: tuple[str, pa.Array]  # (name, values): the output key column
    bad: dict[int, str]  # unit row -> why it cannot be processed (null text, invalid UTF-8)
    copies: UnitCopies  # content hashes, and which rows are copies of which
    read_seconds: float  # reading parts and extracting their texts


def read_columns(options: UnitOptions) -> list[str]:
    return list(dict.fromkeys(c for c in (options.text_column, options.pair_column, options.id_column) if c))


def unit_texts(table: pa.Table, options: UnitOptions, uri: str) -> tuple[list, list | None, list[str | None]]:
    """(texts, pairs or None, reasons): a part's inputs, None where a row is unusable."""
    texts, reasons = text_column(table, options.text_column, uri)
    pairs = None
    if options.pair_column:
        pairs, pair_reasons = text_column(table, options.pair_column, uri)
        reasons = [a or (b and f"{options.pair_column}: {b}") for a, b in zip(reasons, pair_reasons)]
    return texts, pairs, reasons


def unit_keys(unit: Unit, table: pa.Table, options: UnitOptions) -> tuple[str, pa.Array]:
    """(name, values): the id column, or `file#row` keys, stable for the same input."""
    if options.id_column:
        return options.id_column, table.column(options.id_column).combine_chunks()
    return "row_key", pa.array(unit.row_keys(table.num_rows), type=pa.string())


class WindowSender:
    """A unit's read parts as the tokenizer holds them, and its rows to compute; sends each
    window of them to the tokenizer once all its rows are read."""

    def __init__(self, tokenizer: Tokenizing, window_rows: int) -> None:
        self.tokenizer = tokenizer
        self.cutter = WindowCutter(window_rows)
        self.parts: list = []  # each part's texts as the tokenizer holds them
        self.starts: list[int] = []  # each part's first unit row
        self.usable: list[int] = []  # unit rows to compute, in order
        self.rows = 0

    def add(self, texts: list, pairs: list | None, compute: list[bool]) -> None:
        self.starts.append(self.rows)
        self.parts.append(self.tokenizer.put(texts, pairs))
        self.usable.extend(self.rows + i for i, c in enumerate(compute) if c)
        self.rows += len(compute)

    def ready(self, last: bool) -> list[Pending]:
        """Send the windows now complete (with `last`, all the rest; a unit with no usable
        row still sends one empty window, so its shard gets its columns)."""
        cuts = self.cutter.take(len(self.usable), last)
        if last and not self.usable:
            cuts = [(0, 0)]
        return [self._send(start, stop) for start, stop in cuts]

    def _send(self, start: int, stop: int) -> Pending:
        rows = np.array(self.usable[start:stop], dtype=np.int64)
        part = np.searchsorted(self.starts, rows, side="right") - 1
        segments = [(self.parts[i], rows[part == i] - self.starts[i]) for i in np.unique(part)] or [(self.parts[-1], rows)]
        with record_function("pooljobs.submit"):
            return self.tokenizer.submit(rows, segments)


def feed_unit(unit: Unit, options: UnitOptions, tokenizer_for: Callable[[list[str], list[str] | None], Tokenizing],
              windows: SimpleQueue, copies: UnitCopies) -> UnitInput:
    """Read `unit` part by part, putting each window's pending tokens on `windows` as soon
    as its rows are read, then None (also on error). `tokenizer_for`: given the first
    part's usable texts (and their pairs), the tokenizer every window of the unit goes to; `copies` decides
    which rows are computed."""
    sender: WindowSender | None = None
    tables: list[pa.Table] = []
    reasons: list[str | None] = []
    seconds = 0.0
    try:
        parts = read_unit_parts(unit, read_columns(options), options.storage_options)
        while True:
            t = time.perf_counter()
            with record_function("pooljobs.read"):
                table = next(parts, None)
                if table is not None:
                    texts, pairs, part_reasons = unit_texts(table, options, unit.uri)
                    compute = copies.classify(content_hashes(texts, pairs, part_reasons))
            seconds += time.perf_counter() - t
            if table is None:
                break
            if sender is None:
                usable = [i for i, r in enumerate(part_reasons) if r is None]
                sender = WindowSender(tokenizer_for([texts[i] for i in usable],
                                                    None if pairs is None else [pairs[i] for i in usable]),
                                      options.window_rows)
            sender.add(texts, pairs, compute)
            tables.append(table)
            reasons += part_reasons
            for pending in sender.ready(last=False):
                windows.put(pending)
        if sender is None:  # no part at all
            sender = WindowSender(tokenizer_for([], None), options.window_rows)
        for pending in sender.ready(last=True):
            windows.put(pending)
        bad = {i: r for i, r in enumerate(reasons) if r is not None}
        return UnitInput(unit_keys(unit, pa.concat_tables(tables), options), bad, copies, seconds)
    finally:
        windows.put(None)
