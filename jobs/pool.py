"""Workers that outlive one notebook call: a warm pool per loaded model, in this session.

A notebook call (`jobs.embed`, `jobs.classify`, `jobs.score`) takes the pool whose key
matches its job, runs its units on it, and gives it back; the next call with the same key
finds the model loaded (and compiled, and warm) and pays only for its own units. The key
is what shapes the loaded model: the whole `ModelOptions` (model, task, dtype, execution,
compile, pooling, ...), the backend, and for Ray the worker count and whether they take
GPUs. Per-job settings (`UnitOptions`: output, columns, batching) travel with each call,
so they never split pools. This is how Ray Serve keeps replicas and Ray Data's actor
pools keep actors between batches, scoped to this Python session.

A pool is released when it has been idle `IDLE_SECONDS` (a timer), when a call needs
a pool of another key (one model at a time holds a device's memory), on
`jobs.shutdown()`, and at interpreter exit. A CLI run (`python -m jobs.embed`, a
`ray job submit` entrypoint) uses no pool: its actors go with the job, as before.

Placement: a Ray pool's actors are created without waiting; `WorkerActor.ready()`
answers as soon as one is placed, and the driver feeds it from then on. Actors still
waiting after `PLACEMENT_SECONDS` are named and dropped while the placed ones work; none
placed is a `PlacementError` (a user error: the request does not fit the cluster). With
an autoscaler running, pending actors wait for the nodes it adds, and the log says so
every `PROGRESS_SECONDS`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from states.options import ModelOptions

IDLE_SECONDS = float(os.environ.get("POOLJOBS_IDLE_SECONDS", 600))
PLACEMENT_SECONDS = float(os.environ.get("POOLJOBS_PLACEMENT_SECONDS", 120))
PROGRESS_SECONDS = 5.0
IN_FLIGHT = 2  # units per worker: one forwarding, one being read/tokenized or written


class PlacementError(RuntimeError):
    """No worker could be placed within the placement timeout (a user error: exit 2)."""


@dataclass(frozen=True)
class PoolKey:
    """What makes two jobs' workers interchangeable."""

    backend: str  # local | ray
    model_options: ModelOptions
    workers: int = 1
    gpu: bool = False


@dataclass(eq=False)
class LocalPool:
    """One in-process `Worker` (this process's device)."""

    key: PoolKey
    worker: object = None  # workers.actor.Worker, built lazily so this module imports no torch

    def __post_init__(self) -> None:
        if self.worker is None:
            from workers.actor import Worker

            self.worker = Worker(self.key.model_options)

    def close(self) -> None:
        self.worker.close()
        self.worker.runtime = None  # the model's memory goes with the last reference
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@dataclass(eq=False)
class RayPool:
    """`WorkerActor`s of one key. `placed` are those that answered `ready()`; the others
    are still `pending` (waiting for resources, or being started)."""

    key: PoolKey
    actors: list = field(default_factory=list)
    placed: list = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    session: str = ""  # the Ray session the actors live in (a pool outlives no `ray.shutdown()`)

    @classmethod
    def start(cls, key: PoolKey, max_retries: int) -> RayPool:
        import ray

        from workers.actor import WorkerActor

        actor_cls = ray.remote(WorkerActor).options(
            num_gpus=1 if key.gpu else 0, num_cpus=1, max_concurrency=IN_FLIGHT,
            max_restarts=-1, max_task_retries=max_retries,
        )
        return cls(key, [actor_cls.remote(key.model_options) for _ in range(key.workers)], session=ray_session())

    @property
    def pending(self) -> list:
        return [a for a in self.actors if a not in self.placed]

    def drop(self, actors: list) -> None:
        import ray

        for actor in actors:
            self.actors.remove(actor)
            if ray.is_initialized() and self.session == ray_session():
                ray.kill(actor)  # else the actor went with its Ray session

    def close(self) -> None:
        self.drop(list(self.actors))
        self.placed.clear()


def ray_session() -> str:
    """The connected Ray session's name (a Ray Client connection's job id)."""
    import ray

    node = ray._private.worker._global_node
    return node.session_name if node is not None else ray.get_runtime_context().get_job_id()


class Placement:
    """The bounded wait for a Ray pool's pending actors, with progress lines.

    `placed(actor)` records an actor that answered `ready()`; `poll()` is called by the
    dispatch loop each time it wakes while actors are pending; it
    logs every `PROGRESS_SECONDS` while actors are pending and, past `PLACEMENT_SECONDS`
    without an autoscaler, drops the unplaced ones (naming them) or, when none was
    placed, raises `PlacementError`."""

    def __init__(self, pool: RayPool, need: str, autoscaling: Callable[[], bool], log: Callable[[str], None]) -> None:
        self.pool, self.need, self.log = pool, need, log
        self.autoscaling = autoscaling
        self.started = time.perf_counter()
        self.last_line = self.started

    def placed(self, actor) -> None:
        self.pool.placed.append(actor)

    def poll(self) -> list:
        """Actors given up on (already killed); [] while still waiting or when all are placed."""
        pending = self.pool.pending
        if not pending:
            return []
        now = time.perf_counter()
        waited = now - self.started
        if now - self.last_line >= PROGRESS_SECONDS:
            self.last_line = now
            scaling = self.autoscaling()
            why = "the autoscaler is adding nodes" if scaling else f"each needs {self.need}"
            self.log(f"placing workers: {len(self.pool.placed)} of {len(self.pool.actors)} placed after "
                     f"{waited:.0f}s; {len(pending)} waiting to be placed or started ({why})")
            if scaling:
                self.started = now - min(waited, PLACEMENT_SECONDS / 2)  # keep waiting while nodes come
        if waited < PLACEMENT_SECONDS:
            return []
        if self.autoscaling():
            return []
        if not self.pool.placed:
            self.pool.close()
            raise PlacementError(f"none of {len(pending)} workers could be placed within {PLACEMENT_SECONDS:.0f}s: "
                                 f"each needs {self.need} and the cluster has {_resources()}; "
                                 "lower --num-workers, or add nodes")
        self.pool.drop(pending)
        self.log(f"placing workers: gave up on {len(pending)} of {len(pending) + len(self.pool.placed)} workers "
                 f"after {waited:.0f}s (each needs {self.need}; the cluster has {_resources()}); "
                 f"running on {len(self.pool.placed)}")
        return pending


    def unplaced_at_end(self) -> None:
        """Name the workers still pending when the job ended without them."""
        pending = self.pool.pending
        if pending:
            self.log(f"placing workers: {len(pending)} of {len(self.pool.actors)} workers were never placed "
                     f"(each needs {self.need}; the cluster has {_resources()}); the job ran on "
                     f"{len(self.pool.placed)}")


def _resources() -> str:
    import ray

    found = ", ".join(f"{v:g} {k}" for k, v in sorted(ray.cluster_resources().items()) if k in ("CPU", "GPU"))
    return found or "no CPU or GPU"


# -- the session's pools -------------------------------------------------------------------
_lock = threading.Lock()
_idle: dict[PoolKey, tuple[object, threading.Timer]] = {}  # pools between calls, each with its release timer
_busy: list = []  # pools a call holds right now (for shutdown at exit)


def take(key: PoolKey):
    """The idle pool of `key` (its timer stopped), or None; idle pools of other keys are
    released, since one model at a time holds the device's memory."""
    with _lock:
        found = _idle.pop(key, None)
        others = [_idle.pop(k) for k in list(_idle)]
        if found is not None:
            found[1].cancel()
            _busy.append(found[0])
    for pool, timer in others:
        timer.cancel()
        pool.close()
    return None if found is None else found[0]


def hold(pool) -> None:
    """Count a newly started pool as held by the current call."""
    with _lock:
        _busy.append(pool)


def give(pool) -> None:
    """Keep `pool` for the next call with its key; released after `IDLE_SECONDS` idle."""
    timer = threading.Timer(IDLE_SECONDS, _expire, args=(pool,))
    timer.daemon = True
    with _lock:
        _busy.remove(pool)
        old = _idle.pop(pool.key, None)
        _idle[pool.key] = (pool, timer)
    if old is not None:  # two calls of one key ran at once: keep one pool
        old[1].cancel()
        old[0].close()
    timer.start()


def discard(pool) -> None:
    """Close a pool a call held but cannot give back (it failed or was interrupted)."""
    with _lock:
        if pool in _busy:
            _busy.remove(pool)
    pool.close()


def _expire(pool) -> None:
    with _lock:
        current = _idle.get(pool.key)
        if current is None or current[0] is not pool:
            return
        del _idle[pool.key]
    pool.close()


def idle_keys() -> list[PoolKey]:
    with _lock:
        return list(_idle)


def shutdown() -> None:
    """Release every pool of this session (idle or held) and stop the local Ray that
    pooljobs started, if any. The next call starts afresh."""
    with _lock:
        pools = [p for p, _ in _idle.values()] + list(_busy)
        timers = [t for _, t in _idle.values()]
        _idle.clear()
        _busy.clear()
    for timer in timers:
        timer.cancel()
    for pool in pools:
        try:
            pool.close()
        except Exception:  # noqa: BLE001 - at exit Ray may already be gone; nothing is left to free
            pass
    driver = sys.modules.get("jobs.driver")  # not imported: this session started no Ray
    if driver is not None:
        driver.stop_ray()


atexit.register(shutdown)
