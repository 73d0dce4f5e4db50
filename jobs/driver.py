"""The driver: plan units, claim the output, keep workers fed, commit, report.

It knows no model. Work goes to Ray actors (one per GPU, or CPU workers) through a
bounded `ray.wait` loop: each actor holds at most `IN_FLIGHT` units, so memory stays
flat however large the corpus. A dead actor is restarted by Ray (`max_restarts=-1`)
and Ray retries its in-flight calls (`max_task_retries`); a unit whose error is not
about its own data is retried on any worker up to `max_retries`, then recorded as
failed. The `local` backend runs the same `UnitRunner` in this process.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from jobs.manifest import Manifest
from jobs.plan import input_fingerprint, list_inputs, plan_units
from jobs.preflight import check_job
from jobs.progress import Progress
from jobs.spec import JobSpec
from states.loading import check_model_dir, fingerprint
from states.runtime import Runtime
from workers.reader import InputError, Unit
from workers.unit import VERSION, RowError, UnitResult, UnitRunner

IN_FLIGHT = 2  # units per actor: one forwarding, one being read/tokenized or written
PERMANENT = (InputError, RowError)  # errors about the data itself: retrying cannot help
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    """What a finished (or partly failed) job did."""

    output: str
    report: dict
    failed: dict[str, str] = field(default_factory=dict)  # unit name -> error

    @property
    def ok(self) -> bool:
        return not self.failed


def identity(spec: JobSpec, files: list, units: list[Unit]) -> dict:
    """What makes an output directory this job's: a resume must match it exactly."""
    model_dir = check_model_dir(spec.model, spec.allow_pickle, spec.revision)
    return {"pooljobs_version": VERSION, "options": spec.fingerprint_fields(), "model_sha256": fingerprint(model_dir),
            "input": spec.inputs, "input_sha256": input_fingerprint(files), "units": [u.name for u in units]}


def run_job(spec: JobSpec) -> Outcome:
    t0 = time.perf_counter()
    files = list_inputs(spec)
    units = check_job(spec, files, plan_units(spec, files))
    manifest = Manifest(spec.output, spec.storage_options)
    job = identity(spec, files, units)
    manifest.prepare(job, spec.overwrite)
    try:
        done = manifest.committed_names()
        todo = [u for u in units if u.name not in done]
        progress = Progress(len(todo), spec.progress)
        failed: dict[str, str] = {}
        run: dict = {"workers": [], "run_seconds": 0.0}

        def on_result(result: UnitResult) -> None:
            manifest.commit(result.to_json())
            progress.update(result.rows, result.tokens)

        try:
            if todo:
                runner = _run_local if spec.backend == "local" else _run_ray  # "auto" and "ray" use Ray
                run = runner(spec, job["model_sha256"], todo, on_result, failed)
        finally:
            progress.close()
            manifest.flush()
        report = build_report(units, manifest.committed(), failed, time.perf_counter() - t0, [u.name for u in todo])
        report.update(run)
        manifest.finish(report, success=not failed)
    finally:
        manifest.close()
    return Outcome(spec.output, report, failed)


def _settle(unit: Unit, error: BaseException, attempts: Counter, spec: JobSpec, failed: dict, queue: deque) -> None:
    """Requeue a unit that failed for a reason retrying can fix, else record it failed.
    A bad row under on_error='fail' (RowError) also empties the queue: the job stops."""
    attempts[unit.name] += 1
    if not isinstance(error, PERMANENT) and attempts[unit.name] <= spec.max_retries:
        queue.append(unit)
        return
    failed[unit.name] = f"{type(error).__name__}: {error}"
    if isinstance(error, RowError):
        queue.clear()


def _run_local(spec: JobSpec, model_sha256: str, units: list[Unit], on_result: Callable, failed: dict) -> dict:
    t = time.perf_counter()
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options), model_sha256)
    runner.warm_up()
    info = {"worker": runner.worker, "load_seconds": time.perf_counter() - t, "max_tokens": runner.max_tokens}
    attempts: Counter = Counter()
    queue = deque(units)
    t = time.perf_counter()
    try:
        while queue:
            unit = queue.popleft()
            try:
                on_result(runner.run(unit))
            except Exception as e:  # noqa: BLE001 - classified by _settle
                _settle(unit, e, attempts, spec, failed, queue)
    finally:
        runner.close()
    return {"workers": [info], "run_seconds": time.perf_counter() - t}


def init_ray(address: str | None) -> bool:
    """Connect to the given cluster, the one a submitted job runs in, or start a local Ray.
    Returns True when this call started Ray (and should stop it).

    A local Ray starts without its dashboard. Its gRPC servers cannot be held to loopback
    (Ray 2.60 turns a 127.0.0.1 node address into the host's routable one and binds its
    core servers there): Ray's token authentication, on by default, is what guards them.
    """
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return False
    ray.init(
        address="local", include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}},
    )
    return True


def _run_ray(spec: JobSpec, model_sha256: str, units: list[Unit], on_result: Callable, failed: dict) -> dict:
    import ray
    from ray.exceptions import RayError

    from workers.actor import WorkerActor

    started = init_ray(spec.address)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    # device=cuda asks for GPU actors even when none are up yet: the autoscaler adds nodes.
    use_gpu = gpus > 0 or spec.device.startswith("cuda")
    count = spec.num_workers or max(1, gpus)
    actor_cls = ray.remote(WorkerActor).options(
        num_gpus=1 if use_gpu else 0, num_cpus=1, max_concurrency=IN_FLIGHT,
        max_restarts=-1, max_task_retries=spec.max_retries,
    )
    actors = [actor_cls.remote(spec.model_options, spec.unit_options, model_sha256) for _ in range(count)]
    try:
        infos = ray.get([a.info.remote() for a in actors])
        t = time.perf_counter()
        attempts: Counter = Counter()
        load: Counter = Counter()
        queue = deque(units)
        inflight: dict = {}
        while queue or inflight:
            while queue and min(load[i] for i in range(count)) < IN_FLIGHT:
                i = min(range(count), key=lambda k: load[k])
                unit = queue.popleft()
                inflight[actors[i].run.remote(unit)] = (unit, i)
                load[i] += 1
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                unit, i = inflight.pop(ref)
                load[i] -= 1
                try:
                    on_result(ray.get(ref))
                except RayError as e:  # task errors, dead actors, lost objects or nodes
                    cause = getattr(e, "cause", None)  # the worker's own exception, for task errors
                    _settle(unit, cause if isinstance(cause, Exception) else e, attempts, spec, failed, queue)
        return {"workers": infos, "run_seconds": time.perf_counter() - t}
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()


def build_report(units: list[Unit], committed: dict, failed: dict, wall: float, ran: list[str]) -> dict:
    """Totals over every committed unit; rates over the units this run did."""
    records = [committed[u.name] for u in units if u.name in committed]
    now = [committed[n] for n in ran if n in committed]
    rows_now, tokens_now = sum(r["rows"] for r in now), sum(r["tokens"] for r in now)
    rows = sum(r["rows"] for r in records)
    tokens = sum(r["tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    per_worker: dict[str, dict] = defaultdict(lambda: {"units": 0, "rows": 0, "tokens": 0, "forward_seconds": 0.0})
    for r in records:
        w = per_worker[r["worker"]]
        w["units"] += 1
        w["rows"] += r["rows"]
        w["tokens"] += r["tokens"]
        w["forward_seconds"] += r["seconds"]["forward"]
    for w in per_worker.values():
        w["tokens_per_s_forward"] = w["tokens"] / w["forward_seconds"] if w["forward_seconds"] else None
    unit_file = {u.name: u.uri for u in units}
    return {
        "units": len(units), "units_committed": len(records), "units_run_now": len(now),
        "units_failed": [{"unit": n, "file": unit_file[n], "error": e} for n, e in sorted(failed.items())],
        "rows": rows, "rows_quarantined": sum(r["errors"] for r in records), "tokens": tokens,
        "rows_truncated": sum(r["truncated"] for r in records),
        "duplicate_ids_within_units": sum(r.get("duplicate_ids", 0) for r in records),
        "padding_efficiency": tokens / padded if padded else None,
        "wall_seconds": wall, "rows_per_s": rows_now / wall, "tokens_per_s": tokens_now / wall,
        "stage_seconds": {k: sum(r["seconds"].get(k, 0.0) for r in records) for k in ("read", "tokenize", "wait_tokens", "forward", "write", "commit")},
        "per_worker": dict(per_worker),
    }
