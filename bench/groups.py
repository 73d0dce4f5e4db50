"""Per-launch-group timeline of runs in a Ray GPU actor, without the profiler.

    python -m bench.groups --tokenizer DIR [--shape bert-base] [--docs 40000] [--reps 3]

`bench.timeline` profiles with `torch.profiler`, which records every op: on the H200 it
tripled a launch's host time (29 ms against 9 ms) and so blamed launching for idle time
that was not there. This runs the corpus's units the way the job does (a Ray actor with
two units in flight, tokenizing in Ray tasks, after the same warm-up) several times, and
records only the worker's own `pooljobs.*` ranges with a clock and each launch group's
device start and end with the CUDA events `DeviceTimer` already records. Per run it
prints every group's host launch time, device span and the device's idle gap before it,
the ranges' totals, and when the first windows' tokens came back, split into the wait
for a task process, the tokenizing in it and the way back (traced in the task itself).
`--in-process` runs the same object in this process instead of an actor (launches cost
~20-25 ms of host time in the actor against ~9 ms in a process: is the actor the cause?).
`--variants` runs the same actor under other settings in turn, e.g.
`--variants "base;switch=0.0005;RAMP_GROWTH=1.15,window_rows=128"`: `switch` is Python's
thread switch interval (s), upper-case names are `workers.batching` constants and the others
`JobSpec` fields.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.__main__ import corpus_job


def _traced_encode(key: str, spec_ref: list, rows, segments):
    """`workers.tokenize_pool`'s task, also returning its process and its wall-clock span."""
    from workers.tokenize_pool import _encode_task

    start = time.time()
    window = _encode_task(key, spec_ref, rows, segments)
    return window, (os.getpid(), start, time.time())


class Recorder:
    """Lives in the actor: wraps `workers.unit`'s ranges and device timers with clocks."""

    def __init__(self, spec) -> None:
        import torch

        import workers.unit as unit
        from states.runtime import Runtime
        from workers.unit import UnitRunner

        self.torch, self.spans, self.timers, self.windows = torch, [], [], []
        import workers.feed as feed

        unit.record_function = feed.record_function = self._range  # the worker's own ranges, timed, no profiler
        timer_init = unit.DeviceTimer.__init__

        def init(timer, device) -> None:
            timer_init(timer, device)
            timer.host_start = time.perf_counter()
            self.timers.append(timer)

        unit.DeviceTimer.__init__ = init
        t = time.perf_counter()
        self.runner = UnitRunner(spec.replace(tokenize_in="tasks").unit_options, Runtime(spec.model_options), model_sha256="-")
        self.runner.warm_up()
        self.load_seconds = time.perf_counter() - t
        tokenizer = self.runner.tokenizer
        import ray

        traced = ray.remote(_traced_encode).options(**tokenizer._options)

        def timed_submit(rows, segments) -> Future:
            sent, wall = time.perf_counter(), time.time()
            pending, out = traced.remote(tokenizer.key, [tokenizer._spec_ref], rows, segments).future(), Future()

            def done(f: Future) -> None:
                window, (pid, start, end) = f.result()
                back = time.perf_counter()
                self.windows.append((sent, back, len(rows), start - wall, end - start, back - sent - (end - wall), pid))
                out.set_result(window)

            pending.add_done_callback(done)
            return out

        tokenizer.submit = timed_submit

    def configure(self, settings: dict[str, str]) -> None:
        """Apply a variant's settings (see the module's doc), every other one at its default."""
        import dataclasses

        import workers.batching as batching

        if not hasattr(self, "defaults"):
            self.defaults = (sys.getswitchinterval(), {k: getattr(batching, k) for k in dir(batching) if k.isupper()},
                             self.runner.options)
        switch, constants, options = self.defaults
        sys.setswitchinterval(float(settings.get("switch", switch)))
        for name, value in constants.items():
            setattr(batching, name, type(value)(settings.get(name, value)))
        fields = {k: type(getattr(options, k))(v) for k, v in settings.items() if k != "switch" and not k.isupper()}
        self.runner.options = dataclasses.replace(options, **fields)

    @contextlib.contextmanager
    def _range(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append((name, threading.current_thread().name, t, time.perf_counter()))

    def start(self) -> float:
        """Clears the records and marks time zero on both clocks; returns the load time."""
        self.spans.clear(), self.timers.clear(), self.windows.clear()
        self.ref = None
        if self.torch.cuda.is_available():
            self.torch.cuda.synchronize()
            self.ref = self.torch.cuda.Event(enable_timing=True)
            self.ref.record()
            self.ref.synchronize()
        self.t0 = time.perf_counter()
        return self.load_seconds

    def run(self, unit) -> int:
        return self.runner.run(unit).tokens

    def _ms(self, mark) -> float:
        """A timer's mark in ms since `start`: a CUDA event, or a host clock reading on CPU."""
        return self.ref.elapsed_time(mark) if self.ref is not None else (mark - self.t0) * 1e3

    def report(self, label: str) -> str:
        lines = [f"## {label}", "| group | host launch ms | device start | device ms | idle before |", "|---|---|---|---|---|"]
        end = busy = 0.0
        for i, timer in enumerate(self.timers):
            a, b = self._ms(timer._start), self._ms(timer._end)
            lines.append(f"| {i} | {(timer.host_start - self.t0) * 1e3:.1f} | {a:.1f} | {b - a:.1f} | {a - end:.1f} |")
            end, busy = b, busy + b - a
        lines.append(f"# device spans {busy:.0f} ms over {len(self.timers)} groups, last ends at {end:.0f} ms")
        totals: dict[tuple[str, str], list[float]] = {}
        for name, thread, a, b in self.spans:
            totals.setdefault((name, thread), []).append(b - a)
        lines += [f"# {name} on {thread}: {len(d)} x, {sum(d) * 1e3:.0f} ms" for (name, thread), d in sorted(totals.items())]
        if self.windows:
            lines.append("# first windows: sent ms, back ms, rows | ms waiting for a process, tokenizing, coming back | pid")
            lines += [f"#   {(a - self.t0) * 1e3:.0f}, {(b - self.t0) * 1e3:.0f}, {n} | {q * 1e3:.0f}, {r * 1e3:.0f}, "
                      f"{back * 1e3:.0f} | {pid}" for a, b, n, q, r, back, pid in sorted(self.windows)[:24]]
            w = np.array([row[:6] for row in self.windows])
            latency, queued, ran, back = (w[:, 1] - w[:, 0]) * 1e3, w[:, 3] * 1e3, w[:, 4] * 1e3, w[:, 5] * 1e3
            lines.append(f"# {len(w)} windows in {len({row[6] for row in self.windows})} processes: back after median "
                         f"{np.median(latency):.0f} ms, max {latency.max():.0f}; waiting for a process median "
                         f"{np.median(queued):.0f}, max {queued.max():.0f}; tokenizing median {np.median(ran):.0f}, max "
                         f"{ran.max():.0f}; coming back median {np.median(back):.0f}, max {back.max():.0f}")
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--unit-rows", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--in-process", action="store_true", help="run the worker in this process, not an actor")
    parser.add_argument("--variants", default="base", help="settings to run in turn, ';' between variants")
    args = parser.parse_args()

    import ray
    import torch

    from jobs.driver import IN_FLIGHT, init_ray
    from jobs.plan import list_inputs, plan_units

    spec = corpus_job(args.tokenizer, args.docs, args.shape, args.unit_rows, "pooljobs-groups-")
    units = plan_units(spec, list_inputs(spec))
    init_ray(None)
    if args.in_process:
        recorder, pool = Recorder(spec), ThreadPoolExecutor(IN_FLIGHT)

        def call(method: str, *a):
            return getattr(recorder, method)(*a)

        def run_all() -> list[int]:
            return [f.result() for f in [pool.submit(recorder.run, u) for u in units]]
    else:
        gpus = 1 if torch.cuda.is_available() else 0
        actor = ray.remote(Recorder).options(num_gpus=gpus, num_cpus=1, max_concurrency=IN_FLIGHT).remote(spec)

        def call(method: str, *a):
            return ray.get(getattr(actor, method).remote(*a))

        def run_all() -> list[int]:
            return ray.get([actor.run.remote(u) for u in units])  # both in flight, as the driver sends them
    where = "this process" if args.in_process else "an actor"
    print(f"# {args.shape} in {where}: {len(units)} units, load {call('start'):.1f} s", flush=True)
    summary = []
    for variant in args.variants.split(";"):
        settings = dict(kv.split("=", 1) for kv in variant.split(",") if "=" in kv)
        call("configure", settings)
        for rep in range(args.reps):
            call("start")
            t = time.perf_counter()
            tokens = sum(run_all())
            wall = time.perf_counter() - t
            summary.append(f"# {variant}, run {rep}: {wall:.3f} s, {tokens / wall:,.0f} tokens/s")
            print(f"\n{summary[-1]} (the driver's clock)")
            print(call("report", f"{variant}, run {rep}"), flush=True)
    print("\n" + "\n".join(summary))
    ray.shutdown()


if __name__ == "__main__":
    main()
