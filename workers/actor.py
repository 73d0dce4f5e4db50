"""The Ray actor: one per GPU (or CPU worker), holding a loaded `UnitRunner`.

Thin on purpose: it loads the model once and forwards units to `UnitRunner.run`. It is
created with `max_concurrency=2`, so while one unit's forward runs the next unit is
read and tokenized, and the previous one written (see `workers.unit`). On a GPU it
takes one CPU of Ray's for its own host thread; tokenizing runs in tasks beside it.
"""

from __future__ import annotations

import os
import time

from states.options import ModelOptions
from states.runtime import Runtime
from workers.options import UnitOptions
from workers.reader import Unit
from workers.unit import UnitResult, UnitRunner


class WorkerActor:
    def __init__(self, model_options: ModelOptions, unit_options: UnitOptions, model_sha256: str | None = None) -> None:
        t = time.perf_counter()
        runtime = Runtime(model_options)
        # A GPU worker leaves tokenizing to Ray CPU tasks; a CPU worker does it in-process.
        self.runner = UnitRunner(unit_options, runtime, model_sha256, tokenize_in_tasks=runtime.device.type == "cuda")
        self.runner.warm_up()
        self.load_seconds = time.perf_counter() - t

    def info(self) -> dict:
        """Who this worker is and what loading cost, for the report."""
        return {"worker": self.runner.worker, "pid": os.getpid(), "load_seconds": self.load_seconds,
                "max_tokens": self.runner.max_tokens, "state": self.runner.runtime.state.kind,
                "compiled": self.runner.runtime.compiled,
                "execution": self.runner.runtime.state.execution}

    def run(self, unit: Unit) -> UnitResult:
        return self.runner.run(unit)
