"""Per-launch-group timeline of runs in a Ray GPU actor, without the profiler.

    python -m bench.groups --tokenizer DIR [--shape bert-base] [--docs 40000] [--reps 3]

`bench.timeline` profiles with `torch.profiler`, which records every op: on the H200 it
tripled a launch's host time (29 ms against 9 ms) and so blamed launching for idle time
that was not there. This runs the corpus's units the way the job does (a Ray actor with
two units in flight, tokenizing in Ray tasks, after the same warm-up) several times, and
records only the worker's own `pooljobs.*` ranges with a clock and each launch group's
device start and end with the CUDA events `DeviceTimer` already records. Per run it
prints every group's host launch time, device span and the device's idle gap before it,
the ranges' totals, and when the first windows' tokens came back.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.__main__ import build_model, make_corpus, pooling_of, write_corpus


class Recorder:
    """Lives in the actor: wraps `workers.unit`'s ranges and device timers with clocks."""

    def __init__(self, spec) -> None:
        import torch

        import workers.unit as unit
        from workers.unit import UnitRunner

        self.torch, self.spans, self.timers, self.windows = torch, [], [], []
        unit.record_function = self._range  # the worker's own ranges, timed, no profiler
        timer_init = unit.DeviceTimer.__init__

        def init(timer, device) -> None:
            timer_init(timer, device)
            timer.host_start = time.perf_counter()
            self.timers.append(timer)

        unit.DeviceTimer.__init__ = init
        t = time.perf_counter()
        self.runner = UnitRunner(spec, model_sha256="-", tokenize_in_tasks=True)
        self.runner.warm_up()
        self.load_seconds = time.perf_counter() - t
        submit = self.runner.tokenizer.submit

        def timed_submit(rows, texts, pairs):
            sent, pending = time.perf_counter(), submit(rows, texts, pairs)
            pending.add_done_callback(lambda _: self.windows.append((sent, time.perf_counter(), len(rows))))
            return pending

        self.runner.tokenizer.submit = timed_submit

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
            first = sorted(self.windows)[:20]
            lines.append("# first windows (sent ms, tokens back ms, rows): "
                         + ", ".join(f"({(a - self.t0) * 1e3:.0f}, {(b - self.t0) * 1e3:.0f}, {n})" for a, b, n in first))
            latency = [(b - a) * 1e3 for a, b, _ in self.windows]
            lines.append(f"# {len(latency)} windows: tokens back after median {np.median(latency):.0f} ms, max {max(latency):.0f} ms")
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--unit-rows", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    import ray
    import torch

    from jobs.driver import IN_FLIGHT, init_ray
    from jobs.plan import list_inputs, plan_units
    from jobs.spec import JobSpec

    root = Path(tempfile.mkdtemp(prefix="pooljobs-groups-"))
    write_corpus(make_corpus(args.tokenizer, args.docs), root / "corpus.parquet")
    model_dir = build_model(args.shape, args.tokenizer, root)
    spec = JobSpec(input=str(root / "corpus.parquet"), output=str(root / "out"), model=str(model_dir), id_column="id",
                   pooling=pooling_of(args.shape), normalize=True, unit_rows=args.unit_rows, progress=None)
    units = plan_units(spec, list_inputs(spec))
    init_ray(None)
    gpus = 1 if torch.cuda.is_available() else 0
    actor = ray.remote(Recorder).options(num_gpus=gpus, num_cpus=1, max_concurrency=IN_FLIGHT).remote(spec)
    print(f"# {args.shape}: {len(units)} units, load {ray.get(actor.start.remote()):.1f} s", flush=True)
    for rep in range(args.reps):
        ray.get(actor.start.remote())
        t = time.perf_counter()
        tokens = sum(ray.get([actor.run.remote(u) for u in units]))  # both in flight, as the driver sends them
        wall = time.perf_counter() - t
        print(f"\n# run {rep}: {wall:.3f} s, {tokens / wall:,.0f} tokens/s (the driver's clock)")
        print(ray.get(actor.report.remote(f"run {rep}")), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
