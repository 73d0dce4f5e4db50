"""Where windows get tokenized: a thread of this process, or Ray CPU tasks.

`ThreadTokenizer` (the default): one background thread, in order; the fast backends and
HF `tokenizers` spread each batch over the host's cores and release the GIL, so the
thread launching the forward keeps running. `RayTokenizer` (`tokenize_in="tasks"`, or
"auto" for a GPU worker whose tokenizer has no exact fast backend): each window in a
single-threaded Ray CPU task (parallelism is the number of tasks, scaled by Ray across the
cluster's CPUs), flat int32 arrays back through the object store; Ray retries a task
whose process dies. Texts cross to the tasks once per read part (`put`: an Arrow table in
the object store, read zero-copy), and each window's task gets only row numbers within
the parts it spans, so sending a window costs the worker little of its own GIL time.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from workers.tokenize import BatchTokenizer, EncodedWindow, TokenizerSpec, encode_window

Pending = Future  # of an EncodedWindow
Texts = tuple[list[str | None], list[str | None] | None]  # a read part's texts (None: unusable) and pairs
Segment = tuple[Any, np.ndarray]  # (a part as `put` returned it; (k,) int64 rows within it)


def part_table(texts: list[str | None], pairs: list[str | None] | None) -> pa.Table:
    """A read part's texts (None for unusable rows), and pairs, as a table for the tasks."""
    columns = {"text": pa.array(texts, pa.large_string())}
    if pairs is not None:
        columns["pair"] = pa.array(pairs, pa.large_string())
    return pa.table(columns)


def _encode_lists(tokenize: BatchTokenizer, rows: np.ndarray, segments: list[Segment]) -> EncodedWindow:
    """Tokenize the window whose texts are `segments`' rows (parts as `Texts`), in order."""
    def column(k: int) -> list:
        return [part[k][i] for part, local in segments for i in local.tolist()]

    return encode_window(tokenize, rows, column(0), None if segments[0][0][1] is None else column(1))


def _encode_parts(tokenize: BatchTokenizer, rows: np.ndarray, segments: list[Segment]) -> EncodedWindow:
    """Tokenize the window whose texts are `segments`' rows (parts as tables), in order."""
    window = pa.concat_tables([part.take(local) for part, local in segments])
    pairs = window.column("pair").to_pylist() if "pair" in window.column_names else None
    return encode_window(tokenize, rows, window.column("text").to_pylist(), pairs)


class ThreadTokenizer:
    """Tokenizes windows in order on one background thread of this process."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.tokenize = spec.build()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def put(self, texts: list[str | None], pairs: list[str | None] | None) -> Texts:
        return texts, pairs

    def submit(self, rows: np.ndarray, segments: list[Segment]) -> Pending:
        """Tokenize window `rows`, whose texts are `segments` (their rows in order)."""
        return self._pool.submit(_encode_lists, self.tokenize, rows, segments)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_BUILT: OrderedDict[str, BatchTokenizer] = OrderedDict()  # per Ray worker process


def _built(key: str, spec_ref: list) -> BatchTokenizer:
    """This process's tokenizer for `key`, built on first use. The spec travels as a
    nested reference so it is fetched only by processes that lack it."""
    if key not in _BUILT:
        import ray

        _BUILT[key] = ray.get(spec_ref[0]).build()
        while len(_BUILT) > 4:  # least recently used first
            _BUILT.popitem(last=False)
    _BUILT.move_to_end(key)
    return _BUILT[key]


def _encode_task(key: str, spec_ref: list, rows: np.ndarray, segments: list[Segment]) -> EncodedWindow:
    import ray

    parts = ray.get([ref for ref, _ in segments])  # nested references: fetched here, zero-copy
    return _encode_parts(_built(key, spec_ref), rows, [(part, local) for part, (_, local) in zip(parts, segments)])


def _warm_task(key: str, spec_ref: list, segments: list[Segment], hold: float) -> str:
    """Tokenize a one-row window the way `_encode_task` does, building the tokenizer and
    fetching a part (a first fetch in a process is slow); then stay busy for `hold`
    seconds (warm-up tasks that end at once would all reuse the first process, and Ray
    would start the others mid-run); returns which process this is."""
    import ray

    _encode_task(key, spec_ref, np.zeros(1, np.int64), segments)
    time.sleep(hold)
    return f"{ray.get_runtime_context().get_node_id()}:{os.getpid()}"


class RayTokenizer:
    """Tokenizes each window in a single-threaded Ray CPU task."""

    def __init__(self, spec: TokenizerSpec, max_retries: int = 3) -> None:
        import ray

        self.key, self._spec_ref = spec.key, ray.put(spec)
        self._options = dict(num_cpus=1, max_retries=max_retries,
                             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})  # merged into the job's
        self._task = ray.remote(_encode_task).options(**self._options)

    def put(self, texts: list[str | None], pairs: list[str | None] | None):
        """The part as a table in the object store, once for all its windows' tasks."""
        import ray

        return ray.put(part_table(texts, pairs))

    def submit(self, rows: np.ndarray, segments: list[Segment]) -> Pending:
        """Tokenize window `rows` in a task, whose texts are `segments` (their rows in order)."""
        return self._task.remote(self.key, [self._spec_ref], rows, segments).future()

    def warm_up(self, rounds: int = 3) -> None:
        """One task per free CPU, side by side, at load time: Ray starts task processes on
        demand (a second or more of CPU each), and each builds the tokenizer once; not
        during the first units.

        Repeated (up to `rounds` times) until one round ran in as many processes as tasks:
        a process that came up after another had finished its hold is left without a task,
        so without its tokenizer."""
        import ray

        free = max(1, int(ray.available_resources().get("CPU", 1)))
        warm = ray.remote(_warm_task).options(**self._options)
        segments = [(self.put(["pooljobs warm-up"], None), np.zeros(1, np.int64))]
        for _ in range(rounds):
            if len(set(ray.get([warm.remote(self.key, [self._spec_ref], segments, 1.0) for _ in range(free)]))) == free:
                return

    def close(self) -> None:
        pass


Tokenizing = ThreadTokenizer | RayTokenizer  # put a part's texts and pairs, submit a window's rows, close
