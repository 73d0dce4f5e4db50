"""The Ray actor: one per GPU (or CPU worker), holding one loaded model for many jobs.

An actor is built from `ModelOptions` alone (what shapes the loaded model), so a warm
pool (`jobs.pool`) can hand it to the next job that loads the same model. Constructing
it does nothing heavy: a placed actor answers `ready()` at once, which is how the driver
tells "waiting for resources" from "loading the model". `load()` reads the model;
each job then sends its `Call` (its `UnitOptions` and model hash) with every unit, and
the actor builds that job's `UnitRunner` on the already-loaded `Runtime` the first time
it sees the call. Carrying the call with each unit (a few hundred bytes) keeps an actor
that Ray restarted after a crash able to serve the retried unit: it reloads and rejoins.

It is created with `max_concurrency=2`, so while one unit's forward runs the next unit
is read and tokenized, and the previous one written (see `workers.unit`). On a GPU it
takes one CPU of Ray's for its own host thread; tokenizing runs in tasks beside it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

from states.options import ModelOptions
from workers import bytecode
from workers.options import UnitOptions

if TYPE_CHECKING:  # torch and transformers load in `load`, so a new actor answers `ready()` at once
    from states.runtime import Runtime
    from workers.reader import Unit
    from workers.unit import UnitResult, UnitRunner


@dataclass(frozen=True)
class Call:
    """One job's share of a worker: what its units are read, batched and written with."""

    id: str
    unit_options: UnitOptions
    model_sha256: str | None = None


class Worker:
    """A loaded model and the `UnitRunner`s of the jobs using it (in-process, or inside
    `WorkerActor`). Thread-safe: a Ray actor runs up to two calls at once."""

    in_ray = False  # inside a Ray actor, a GPU worker tokenizes in Ray CPU tasks

    def __init__(self, model_options: ModelOptions) -> None:
        self.model_options = model_options
        self.runtime: Runtime | None = None
        self.loads = 0  # how often this worker read the model (1 unless restarted by hand)
        self.load_seconds = 0.0
        self._runners: dict[str, UnitRunner] = {}
        self._warmed: set[tuple] = set()  # runner shapes whose warm-up already ran on this runtime
        self._warm_up_seconds: dict[str, float] = {}  # call id -> its runner's build and warm-up
        self._unreported: dict[str, float] = {}  # the load's phases, until a join reports them
        self._lock = threading.Lock()

    def load(self) -> dict[str, float]:
        """Read the model (once); returns the seconds it took, as `model_load` (reading,
        placing and a first forward) and `compile` (Dynamo's share of that first forward,
        when blocks were compiled); zeros when already loaded."""
        with self._lock:
            if self.runtime is not None:
                return {"model_load": 0.0}
            t, compiled = time.perf_counter(), _compile_seconds()
            if self.in_ray:  # an actor's own process (locally, the CLI's process has decided)
                bytecode.use()
            from states.runtime import Runtime

            self.runtime = Runtime(self.model_options)
            if self.in_ray:
                bytecode.fill_later()
            self.loads += 1
            self.load_seconds = time.perf_counter() - t
            compile_seconds = _compile_seconds() - compiled
            phases = {"model_load": self.load_seconds - compile_seconds}
            if self.runtime.compiled:
                phases["compile"] = compile_seconds
            self._unreported = phases
            return phases

    def join(self, call: Call) -> dict:
        """Build the call's runner (if `run` has not yet) and say what it cost, for the
        report: this worker's info, the call's warm-up seconds, the model load's phases
        when no join reported them yet, and when it was ready (`joined_at`, `time.time()`:
        the driver's steady run starts at the first worker's)."""
        self._runner(call)
        with self._lock:
            phases, self._unreported = self._unreported, {}
            return {**self.info(call.id), **phases, "warm_up_seconds": self._warm_up_seconds.get(call.id, 0.0),
                    "joined_at": time.time()}

    def _runner(self, call: Call) -> UnitRunner:
        """The call's runner, built on first use on the loaded runtime, and warmed unless a
        runner of the same shape already warmed it."""
        self.load()
        with self._lock:
            runner = self._runners.get(call.id)
            if runner is not None:
                return runner
            from workers.unit import UnitRunner

            t = time.perf_counter()
            runtime = self.runtime
            in_tasks = runtime.device.type == "cuda" and self.in_ray
            runner = UnitRunner(call.unit_options, runtime, call.model_sha256, tokenize_in_tasks=in_tasks)
            shape = (runner.max_tokens, call.unit_options.window_rows, in_tasks)
            if shape not in self._warmed:
                runner.warm_up()
                self._warmed.add(shape)
            self._runners[call.id] = runner
            self._warm_up_seconds[call.id] = time.perf_counter() - t
            return runner

    def run(self, call: Call, unit: Unit) -> UnitResult:
        return self._runner(call).run(unit)

    def leave(self, call_id: str) -> None:
        """Close the call's runner (its tokenizer and writer threads); the model stays."""
        with self._lock:
            runner = self._runners.pop(call_id, None)
            self._warm_up_seconds.pop(call_id, None)
        if runner is not None:
            runner.close()

    def info(self, call_id: str | None = None) -> dict:
        """Who this worker is and what loading cost, for the report."""
        runtime = self.runtime
        runner = self._runners.get(call_id) if call_id else None
        info = {"pid": os.getpid(), "loads": self.loads, "load_seconds": self.load_seconds}
        if runtime is not None:
            provenance = runtime.provenance()
            info.update(worker=runner.worker if runner else str(runtime.device), state=provenance["state"],
                        compiled=provenance["compiled"] == "True", execution=provenance["execution"])
        if runner is not None:
            info["max_tokens"] = runner.max_tokens
        return info

    def close(self) -> None:
        for call_id in list(self._runners):
            self.leave(call_id)


def _compile_seconds() -> float:
    """Seconds Dynamo has spent compiling frames in this process so far."""
    utils = sys.modules.get("torch._dynamo.utils")
    return sum(utils.compilation_time_metrics.get("_compile.compile_inner", [])) if utils else 0.0


class WorkerActor(Worker):
    """`Worker` as a Ray actor; `ready()` answers once the actor is placed and started."""

    in_ray = True

    def ready(self) -> int:
        return os.getpid()
