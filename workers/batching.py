"""The token-budget batching rule: rows -> windows -> launch groups -> packs.

A unit's usable rows are cut into windows (`WindowCutter`: sizes ramp up from `RAMP_ROWS`
by `RAMP_GROWTH` to `window_rows`, so the first ones tokenize quickly), each tokenized as
one batch. Tokenized windows are merged, in order, into launch groups of at least
`group_targets()` tokens (from `FIRST_GROUP_TOKENS`, doubling to `GROUP_TOKENS`): a launch
costs the host a fixed overhead whatever its size, while small first groups start the
device early. Each group is cut into packs by `workers.packing.plan_packs` within the
runtime's token budget and `MAX_SEQS_PER_PACK`.

Every decision is made from row and token counts, never from which windows happen to be
ready, so a rerun packs the same rows together and writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from queue import SimpleQueue

from workers.tokenize import EncodedWindow

MAX_SEQS_PER_PACK = 4096
RAMP_ROWS = 16
RAMP_GROWTH = 1.25
GROUP_TOKENS = 1 << 17  # tokenized windows merged into one launch group, up to this many tokens
FIRST_GROUP_TOKENS = 1 << 14  # a unit's first launch group; the next ones double (`group_targets`)


def window_sizes(window_rows: int) -> Iterator[int]:
    """Window sizes in rows: growing by `RAMP_GROWTH` from `RAMP_ROWS` to `window_rows`."""
    size = min(RAMP_ROWS, window_rows)
    while True:
        yield size
        size = min(window_rows, max(size + 1, int(size * RAMP_GROWTH)))


class WindowCutter:
    """Cuts a unit's usable rows 0, 1, 2, ... into windows of `window_sizes` as they
    become known, part by part: the windows are the same however the rows arrive."""

    def __init__(self, window_rows: int) -> None:
        self._sizes = window_sizes(window_rows)
        self._start, self._size = 0, next(self._sizes)

    def take(self, known: int, last: bool) -> list[tuple[int, int]]:
        """[start, stop) windows complete among the first `known` rows; with `last`
        (all rows known), also the final partial one."""
        windows = []
        while self._start + self._size <= known or (last and self._start < known):
            windows.append((self._start, min(known, self._start + self._size)))
            self._start, self._size = self._start + self._size, next(self._sizes)
        return windows


def group_targets() -> Iterator[int]:
    """Tokens each launch group of a unit holds at least: `FIRST_GROUP_TOKENS`, doubling
    up to `GROUP_TOKENS`."""
    target = min(FIRST_GROUP_TOKENS, GROUP_TOKENS)
    while True:
        yield target
        target = min(2 * target, GROUP_TOKENS)


class WindowStream:
    """The pending windows a feed puts on a queue, in order, then None. Looking ahead
    only when asked keeps a launch from waiting on a window it does not need."""

    def __init__(self, queue: SimpleQueue) -> None:
        self._queue, self._head, self._done = queue, None, False

    def peek(self) -> Future | None:
        if self._head is None and not self._done:
            self._head = self._queue.get()
            self._done = self._head is None
        return self._head

    def pop(self) -> Future | None:
        item, self._head = self.peek(), None
        return item


def launch_groups(windows: WindowStream) -> Iterator[EncodedWindow]:
    """The stream's tokenized windows merged into launch groups: each takes windows until
    it holds its `group_targets()` tokens or the stream ends (waiting for them)."""
    for target in group_targets():
        first = windows.pop()
        if first is None:
            return
        group = [first.result()]
        while sum(g.tokens for g in group) < target and windows.peek() is not None:
            group.append(windows.pop().result())
        yield EncodedWindow.concat(group)
