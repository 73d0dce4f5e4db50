"""The driver's own cost per unit: its dispatch loop (`jobs.driver._run_ray`) feeding
no-op actors that answer at once, so all that is timed is the driver's bookkeeping,
Ray's submit/wait and the result's trip back.

    python -m bench.dispatch [--actors 1,10,100,500] [--units 5000]

Prints, per actor count, the driver process's CPU time per unit (anchor: 1 ms) and the
wall time per unit. Each actor is a process (num_cpus=0) importing only Ray and this module.
"""

from __future__ import annotations

import argparse
import time

import ray

from jobs import pool as pools

ANCHOR_MS = 1.0


@ray.remote(num_cpus=0, max_concurrency=pools.IN_FLIGHT)
class NoopActor:
    """The `WorkerActor` calls the driver makes, doing nothing."""

    def ready(self) -> int:
        return 0

    def load(self) -> dict:
        return {}

    def join(self, call: Call) -> dict:
        return {"warm_up_seconds": 0.0, "joined_at": time.time()}

    def run(self, call: Call, unit: Unit) -> int:
        return unit.row_offset

    def leave(self, call_id: str) -> None:
        return None


def measure(actors: int, units: int) -> tuple[float, float]:
    """(driver CPU ms per unit, wall ms per unit) over `units` units on `actors` actors."""
    # Imported here, not at the top: each actor process imports this module.
    from jobs.driver import Clock, _run_ray
    from jobs.spec import JobSpec
    from states.options import ModelOptions
    from workers.actor import Call
    from workers.options import UnitOptions
    from workers.reader import Unit

    key = pools.PoolKey("ray", ModelOptions(model="noop"), actors, False)
    pool = pools.RayPool(key, [NoopActor.remote() for _ in range(actors)])
    ray.get([a.ready.remote() for a in pool.actors])
    pool.placed = list(pool.actors)
    spec = JobSpec(input="noop", output="noop", model="noop", max_retries=0)
    work = [Unit(f"part-{i:05d}", "noop", "parquet", i, 1) for i in range(units)]
    call = Call("bench", UnitOptions(output="noop"))
    done = []
    cpu, wall = time.process_time(), time.perf_counter()
    _run_ray(spec, pool, call, work, done.append, {}, Clock(None), keep=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert len(done) == units
    pool.close()
    return 1e3 * cpu / units, 1e3 * wall / units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,10,100,500")
    parser.add_argument("--units", type=int, default=5000)
    args = parser.parse_args()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    print(f"{'actors':>7} {'units':>7} {'driver CPU ms/unit':>19} {'vs 1 ms':>8} {'wall ms/unit':>13}")
    for n in (int(a) for a in args.actors.split(",")):
        cpu_ms, wall_ms = measure(n, max(args.units, 4 * n))
        print(f"{n:>7} {max(args.units, 4 * n):>7} {cpu_ms:>19.3f} {cpu_ms / ANCHOR_MS:>7.2f}x {wall_ms:>13.3f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
