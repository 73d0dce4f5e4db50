"""Where windows get tokenized: Ray CPU tasks (GPU workers) or a thread of this process.

A GPU worker cannot tokenize fast enough itself: one process tops out near the forward
rate of a BERT-base, and its Python work (turning encodings into arrays) takes the GIL
from the thread launching the forward. So a GPU worker sends each window to a Ray task
on a CPU (single-threaded; parallelism is the number of tasks, scaled by Ray across the
cluster's CPUs) and receives flat int32 arrays through the object store. Ray retries a
task whose process dies. Workers without a GPU tokenize in one background thread, where
the Rust tokenizer spreads each batch over the host's cores.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from workers.tokenize import BatchTokenizer, EncodedWindow, TokenizerSpec, encode_window

Pending = Future  # of an EncodedWindow


class ThreadTokenizer:
    """Tokenizes windows in order on one background thread of this process."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.tokenize = spec.build()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def submit(self, rows: np.ndarray, texts: list[str], pairs: list[str] | None) -> Pending:
        return self._pool.submit(encode_window, self.tokenize, rows, texts, pairs)

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


def _encode_task(key: str, spec_ref: list, rows: np.ndarray, texts: list[str], pairs: list[str] | None) -> EncodedWindow:
    return encode_window(_built(key, spec_ref), rows, texts, pairs)


def _warm_task(key: str, spec_ref: list, hold: float) -> str:
    """Build the tokenizer, then stay busy for `hold` seconds (warm-up tasks that end at
    once would all reuse the first process, and Ray would start the others mid-run);
    returns which process this is (node and pid)."""
    import ray

    _built(key, spec_ref)
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

    def submit(self, rows: np.ndarray, texts: list[str], pairs: list[str] | None) -> Pending:
        return self._task.remote(self.key, [self._spec_ref], rows, texts, pairs).future()

    def warm_up(self, rounds: int = 3) -> None:
        """One task per free CPU, side by side, at load time: Ray starts task processes on
        demand (a second or more of CPU each, measured to slow a cold run's tokenizing
        2.5x), and each builds the tokenizer once; not during the first units.

        Repeated (up to `rounds` times) until one round ran in as many processes as tasks:
        a process that came up after another had finished its hold is left without a task,
        so without its tokenizer (15 tasks found 14 processes on a loaded 2-core machine)."""
        import ray

        free = max(1, int(ray.available_resources().get("CPU", 1)))
        warm = ray.remote(_warm_task).options(**self._options)
        for _ in range(rounds):
            if len(set(ray.get([warm.remote(self.key, [self._spec_ref], 1.0) for _ in range(free)]))) == free:
                return

    def close(self) -> None:
        pass
