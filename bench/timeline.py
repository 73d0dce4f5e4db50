"""Where an end-to-end run's time goes, from a profile of the GPU worker's own code path.

    python -m bench.timeline --tokenizer DIR [--shape bert-base] [--docs 40000] [--trace FILE]

Runs the corpus's units through a `UnitRunner` the way the GPU actor does (tokenizing in
Ray tasks, two units in flight) under `torch.profiler`, then prints the device's busy
time (the union of its kernels and copies) and splits its idle time by what the worker
was doing meanwhile: the `pooljobs.*` ranges of `workers.unit` open at that moment (on
any thread). Then where the busy time goes: the kernels that took the most of it. Writes
a Chrome trace (chrome://tracing, Perfetto) with `--trace`.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from torch._C._profiler import _ExperimentalConfig
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench.__main__ import SHAPES, corpus_job


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping (start, end) intervals merged into disjoint ones."""
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def idle_by_range(busy: list[tuple[int, int]], ranges: list[tuple[int, int, str]], start: int, end: int) -> Counter:
    """Idle device time (µs) in [start, end), keyed by the set of `pooljobs.*` ranges open
    meanwhile ("" when none): an elementary-interval sweep over both."""
    points = sorted({start, end, *(t for iv in busy for t in iv), *(t for r in ranges for t in r[:2])})
    points = [t for t in points if start <= t <= end]
    busy_starts = np.array([a for a, _ in busy])
    busy_ends = np.array([b for _, b in busy])
    idle: Counter = Counter()
    for a, b in itertools.pairwise(points):
        mid = (a + b) / 2
        i = np.searchsorted(busy_starts, mid, side="right") - 1
        if i >= 0 and busy_ends[i] > mid:
            continue
        open_ = sorted({name for s, e, name in ranges if s <= mid < e})
        idle[" + ".join(open_)] += b - a
    return idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="bert-base", choices=list(SHAPES))
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--unit-rows", type=int, default=20_000)
    parser.add_argument("--trace", type=Path, help="write the Chrome trace here")
    parser.add_argument("--reserve-cpus", type=int, default=0,
                        help="hold this many of Ray's CPUs back from the tokenizing tasks (for this process's threads)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA device: it splits the device's idle time by what the host was doing")

    import ray

    from jobs.driver import IN_FLIGHT, init_ray
    from jobs.plan import list_inputs, plan_units
    from workers.unit import UnitRunner
    from states.runtime import Runtime

    spec = corpus_job(args.tokenizer, args.docs, args.shape, args.unit_rows, "pooljobs-timeline-")
    units = plan_units(spec, list_inputs(spec))
    init_ray(None)
    if args.reserve_cpus:
        ray.get(ray.util.placement_group([{"CPU": args.reserve_cpus}]).ready())
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options), model_sha256="-", tokenize_in_tasks=True)
    runner.warm_up()
    # Ranges open on the units' threads too (the profiler records only its own thread by default).
    config = _ExperimentalConfig(profile_all_threads=True)
    with ThreadPoolExecutor(IN_FLIGHT) as pool, profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                                        experimental_config=config) as prof:
        t = time.perf_counter()
        results = list(pool.map(runner.run, units))  # two units in flight, as in the actor
        wall = time.perf_counter() - t
    runner.close()
    ray.shutdown()  # its task processes must not linger into a benchmark run after this one
    if args.trace:
        prof.export_chrome_trace(str(args.trace))

    events = prof.events()
    # Kernels and copies; the ranges also appear on the device's timeline, spanning their kernels and the gaps between.
    device = [(e.time_range.start, e.time_range.end) for e in events
              if e.device_type == DeviceType.CUDA and not e.name.startswith("pooljobs.")]
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.device_type == DeviceType.CPU and e.name.startswith("pooljobs.")]
    busy = merged(device)
    start = min(r[0] for r in ranges)
    end = max(r[1] for r in ranges)
    tokens = sum(r.tokens for r in results)
    busy_us = sum(b - a for a, b in busy)
    print(f"# {args.shape}: {tokens:,} tokens, {len(units)} units; {wall:.2f} s under the profiler "
          f"({tokens / wall:,.0f} tokens/s); device busy {busy_us / 1e6:.2f} s ({tokens / busy_us * 1e6:,.0f} tokens/s of device time)")
    print(f"# first kernel at +{(busy[0][0] - start) / 1e3:.0f} ms, last ends {(end - busy[-1][1]) / 1e3:.0f} ms before the end")
    print("| device idle while | ms |")
    print("|---|---|")
    for name, us in idle_by_range(busy, ranges, start, end).most_common(12):
        print(f"| {name or '(no pooljobs range)'} | {us / 1e3:.0f} |")
    kernels, calls = Counter(), Counter()
    for e in events:
        if e.device_type == DeviceType.CUDA and not e.name.startswith("pooljobs."):
            kernels[e.name[:80]] += e.time_range.end - e.time_range.start
            calls[e.name[:80]] += 1
    print("| kernel (first 80 characters) | calls | ms | share of busy time |")
    print("|---|---|---|---|")
    for name, us in kernels.most_common(15):
        print(f"| {name} | {calls[name]} | {us / 1e3:.0f} | {us / busy_us:.1%} |")
    for r in results:
        print(f"# unit {r.name}: wall {r.wall_seconds:.2f} s, {({k: round(v, 3) for k, v in r.seconds.items()})}")


if __name__ == "__main__":
    main()
