"""The driver: plan units, claim the output, keep workers fed, commit, report.

It knows no model. Work goes to workers through a bounded loop: each worker holds at
most `IN_FLIGHT` units, so memory stays flat however large the corpus, and the driver
keeps only the committed units' names and running totals (the report streams over the
manifest). On Ray a dead actor is restarted (`max_restarts=-1`) and Ray retries its
in-flight calls; a unit whose error is not about its own data is retried on any worker
up to `max_retries`, then recorded as failed. The `local` backend runs the same
`Worker` in this process.

Start-up runs side by side what does not depend on each other: once the plan and the
checks pass, the actors are created (Ray started first where needed) and start loading
the model (locally: the model loads in a thread) while the driver hashes the model files
and claims the output; each actor gets units as soon as it is placed. Every phase's seconds go to the report's `startup`.

Notebook calls (`keep_workers=True`) take their workers from `jobs.pool` and give them
back; a CLI run's workers go with it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from jobs import pool as pools
from jobs.manifest import Manifest
from jobs.plan import input_fingerprint, list_inputs, save_plan, saved_or_planned
from jobs.preflight import check_job
from jobs.progress import Progress
from jobs.reuse import with_reuse
from jobs.spec import JobSpec
from states.loading import check_model_dir, fingerprint
from workers.actor import Call
from workers.reader import InputError, Unit
from workers.unit import VERSION, RowError, UnitResult

IN_FLIGHT = pools.IN_FLIGHT
PERMANENT = (InputError, RowError)  # errors about the data itself: retrying cannot help
REPO_ROOT = Path(__file__).resolve().parent.parent
# compile="auto" compiles only jobs of at least this many planned rows: below it,
# compiling (and importing Inductor) costs more than the faster forwards save, even with
# Inductor's cache warm (bench.sweep --compile, bench/RESULTS.md).
COMPILE_MIN_ROWS = 1_000_000


@dataclass
class Outcome:
    """What a finished (or partly failed) job did."""

    output: str
    report: dict
    failed: dict[str, str] = field(default_factory=dict)  # unit name -> error

    @property
    def ok(self) -> bool:
        return not self.failed


def planned_rows(units: list[Unit]) -> int | None:
    """Rows of all units, or None when a unit's count is known only once read (JSONL/CSV)."""
    return None if any(u.num_rows < 0 for u in units) else sum(u.num_rows for u in units)


def decide(spec: JobSpec, rows: int | None) -> dict:
    """What the job's size decides, from the rows of the whole job (not of what is left),
    so a resume decides as the first run did: the compile choice the workers get and
    why. Recorded in `_job.json`."""
    if spec.compile != "auto":
        return {"compile": spec.compile, "why": "asked"}
    if rows is not None and rows < COMPILE_MIN_ROWS:
        return {"compile": "off", "why": f"auto: {rows:,} rows < {COMPILE_MIN_ROWS:,}"}
    return {"compile": "auto", "why": "auto: on for packed CUDA runs"}


def choose_backend(spec: JobSpec) -> tuple[str, str]:
    """(backend, why) for `spec.backend`; "auto" runs in-process when Ray is not installed,
    or when no Ray cluster is named or connected and one worker serves (CPU, or one GPU,
    whose in-process worker tokenizes with the fast exact backends on threads beside it);
    on Ray otherwise (a cluster, several workers or several GPUs). One GPU is in-process at
    every size because Ray's start, an actor process and its tokenizing tasks are fixed cost
    that one device does not win back (bench/RESULTS.md, the job-size sweep)."""
    if spec.backend != "auto":
        return spec.backend, "asked"
    if importlib.util.find_spec("ray") is None:
        return "local", "auto: Ray is not installed"
    if spec.address or os.environ.get("RAY_ADDRESS") or _ray_connected():
        return "ray", "auto: a Ray cluster is named or connected"
    if (spec.num_workers or 1) > 1:
        return "ray", f"auto: {spec.num_workers} workers asked"
    gpus = _local_gpus(spec.device)
    if gpus > 1 and not spec.device.startswith("cuda:"):
        return "ray", f"auto: {gpus} GPUs here"
    return "local", "auto: one in-process worker on " + ("one GPU" if gpus else "CPU")


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _local_gpus(device: str) -> int:
    if device == "cpu":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def identity(spec: JobSpec, files: list, units: list[Unit], decisions: dict) -> dict:
    """What makes an output directory this job's: a resume must match it exactly."""
    model_dir = check_model_dir(spec.model, spec.allow_pickle, spec.revision)
    return {"pooljobs_version": VERSION, "options": spec.fingerprint_fields(), "model_sha256": fingerprint(model_dir),
            "input": spec.inputs, "input_sha256": input_fingerprint(files), "units": [u.name for u in units],
            "decisions": decisions}


def run_job(spec: JobSpec, keep_workers: bool = False, started_at: float | None = None) -> Outcome:
    """Run `spec` to the end. `keep_workers`: take the workers from this session's warm
    pool and give them back (notebook calls). `started_at`: the process's start
    (`time.time()` clock), so the startup timeline counts the imports too."""
    t0 = time.perf_counter()
    clock = Clock(started_at)
    files = list_inputs(spec)
    manifest = Manifest(spec.output, spec.storage_options)  # opens nothing until `prepare`
    planned, _ = saved_or_planned(spec, files, manifest)  # no footer read while the listing is unchanged
    units = check_job(spec, files, planned)
    rows = planned_rows(units)
    decisions = decide(spec, rows)
    backend, why = choose_backend(spec)
    decisions["backend"] = f"{backend} ({why})"
    print(f"pooljobs: backend {backend} ({why}); compile {decisions['compile']} ({decisions['why']})",
          file=sys.stderr, flush=True)
    clock.mark("plan")
    model_options = spec.model_options
    model_options = type(model_options)(**{**model_options.__dict__, "compile": decisions["compile"]})
    workers = Workers(spec, backend, model_options, keep_workers, clock)
    workers.start()  # Ray, actors, model loads: beside the hashing and the claim below
    try:
        job = identity(spec, files, units, {k: decisions[k] for k in ("compile",)})
        manifest.prepare(job, spec.overwrite)
        save_plan(manifest, spec, files, planned)  # the whole plan (never the --limit cut), after prepare may clear
        clock.mark("claim")
        done = manifest.committed_names()
        todo = [u for u in units if u.name not in done]
        if spec.reuse:
            todo, reuse = with_reuse(spec, todo, job["model_sha256"])
            decisions["reuse"] = reuse.to_json()
            print(f"pooljobs: {reuse.describe()}", file=sys.stderr, flush=True)
        progress = Progress(len(todo), spec.progress)
        failed: dict[str, str] = {}
        run: dict = {"workers": [], "run_seconds": 0.0}

        def on_result(result: UnitResult) -> None:
            manifest.commit(result.to_json())
            progress.update(result.rows, result.tokens)
            clock.first_output()

        try:
            if todo:
                run = workers.run(Call(uuid.uuid4().hex, spec.unit_options, job["model_sha256"]), todo, on_result, failed)
        finally:
            progress.close()
            manifest.flush()
        report = build_report(units, manifest.iter_records(), failed, time.perf_counter() - t0, {u.name for u in todo})
        report.update(run, startup=clock.phases, decisions=decisions)
        manifest.finish(report, success=not failed)
        workers.finish(ok=True)
    except BaseException:
        workers.finish(ok=False)
        raise
    finally:
        manifest.close()
    return Outcome(spec.output, report, failed)


PHASES = ("imports", "plan", "ray", "actors_placed", "model_load", "compile", "warm_up", "claim", "first_output")


class Clock:
    """The startup timeline: each phase's seconds (`PHASES` order). Phases that run side
    by side overlap (the model loads while the output is claimed); `first_output`
    counts from the claim to the first committed unit."""

    def __init__(self, started_at: float | None) -> None:
        self._phases: dict[str, float] = {}
        self.t = time.perf_counter()
        self._first = False
        if started_at is not None:
            self._phases["imports"] = max(0.0, time.time() - started_at)

    def mark(self, phase: str, seconds: float | None = None) -> None:
        now = time.perf_counter()
        self._phases[phase] = round(now - self.t if seconds is None else seconds, 3)
        if seconds is None:
            self.t = now

    @property
    def phases(self) -> dict[str, float]:
        return {p: self._phases[p] for p in PHASES if p in self._phases}

    def first_output(self) -> None:
        if not self._first:
            self._first = True
            self.mark("first_output")


class Workers:
    """The job's workers: started in a thread (`start`), fed by `run`, then given back
    to the pool or closed (`finish`)."""

    def __init__(self, spec: JobSpec, backend: str, model_options, keep: bool, clock: Clock) -> None:
        self.spec, self.backend, self.model_options, self.keep, self.clock = spec, backend, model_options, keep, clock
        self.pool = None
        self.started_ray = False
        self.startup: dict[str, float] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="pooljobs-start", daemon=True)

    def start(self) -> None:
        """Locally the model loads in a thread. Ray starts in this thread: Ray ties its
        processes to the thread that starts them (PR_SET_PDEATHSIG), which must outlive
        them; creating actors does not wait, and they load while this thread goes on."""
        if self.backend == "local":
            self._thread.start()
        else:
            self._start()

    def _start(self) -> None:
        try:
            t = time.perf_counter()
            if self.backend == "local":
                key = pools.PoolKey("local", self.model_options)
                self.pool = (pools.take(key) if self.keep else None) or pools.LocalPool(key)
                self.pool.worker.load()
                return
            self.started_ray = init_ray(self.spec.address)
            self.startup["ray"] = time.perf_counter() - t
            import ray

            gpus = int(ray.cluster_resources().get("GPU", 0))
            use_gpu = gpus > 0 or self.spec.device.startswith("cuda")  # an autoscaler may add GPU nodes
            key = pools.PoolKey("ray", self.model_options, self.spec.num_workers or max(1, gpus), use_gpu)
            taken = pools.take(key) if self.keep else None
            if taken is not None and taken.session != pools.ray_session():  # Ray was restarted since
                pools.discard(taken)
                taken = None
            self.pool = taken or pools.RayPool.start(key, self.spec.max_retries)
            for actor in self.pool.actors:  # each loads as soon as it is placed, while the driver claims the output
                actor.load.remote()
        except BaseException as e:  # noqa: BLE001 - raised in the driver's thread by `_ready`
            self._error = e
        finally:
            if self.pool is not None and self.keep:
                pools.hold(self.pool)

    def _ready(self):
        if self._thread.ident is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self.pool

    def run(self, call: Call, units: list[Unit], on_result: Callable, failed: dict) -> dict:
        pool = self._ready()
        for phase, seconds in self.startup.items():
            self.clock.mark(phase, seconds)
        if self.backend == "local":
            return _run_local(self.spec, pool, call, units, on_result, failed, self.clock)
        return _run_ray(self.spec, pool, call, units, on_result, failed, self.clock, self.keep)

    def finish(self, ok: bool) -> None:
        """Give a notebook's pool back (after a clean run) or close it; stop a Ray this
        job started for itself."""
        if self._thread.ident is not None:
            self._thread.join()
        pool, self.pool = self.pool, None
        if pool is not None:
            if self.keep and ok:
                pools.give(pool)
            elif self.keep:
                pools.discard(pool)
            else:
                pool.close()
        if self.started_ray and not self.keep:
            stop_ray()


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


def _run_local(spec: JobSpec, pool, call: Call, units: list[Unit], on_result: Callable, failed: dict,
               clock: Clock) -> dict:
    worker = pool.worker
    joined = worker.join(call)
    for phase in ("model_load", "compile"):
        if phase in joined:
            clock.mark(phase, joined[phase])
    clock.mark("warm_up", joined["warm_up_seconds"])
    attempts: Counter = Counter()
    queue = deque(units)
    t = time.perf_counter()
    try:
        while queue:
            unit = queue.popleft()
            try:
                on_result(worker.run(call, unit))
            except Exception as e:  # noqa: BLE001 - classified by _settle
                _settle(unit, e, attempts, spec, failed, queue)
    finally:
        worker.leave(call.id)
    return {"workers": [joined], "run_seconds": time.perf_counter() - t}


_started_ray = False  # whether this process started the Ray it is connected to


def init_ray(address: str | None) -> bool:
    """Connect to the given cluster, the one a submitted job runs in, or start a local Ray.
    Returns True when this call started Ray (and should stop it).

    A local Ray starts without its dashboard and with its metrics off: Ray 2.60 turns a
    127.0.0.1 node address into the host's routable one, so its Prometheus endpoints
    (the agent's exporter, the dashboard head's and the autoscaler monitor's servers)
    would answer on every interface without a token. Its gRPC servers, which cannot be
    held to loopback, are guarded by Ray's token authentication (on by default). A
    watcher process (`jobs.reaper`) stops the Ray processes should this one die
    without stopping them.
    """
    global _started_ray
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return False
    # Read by Ray's processes at start: no metrics export; the two Prometheus servers
    # that take no address get a port they cannot bind, so they log that and serve nothing.
    quiet = {"RAY_enable_metrics_collection": "0", "DASHBOARD_METRIC_PORT": "-1", "AUTOSCALER_METRIC_PORT": "-1"}
    saved = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    try:
        ray.init(
            address="local", include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}},
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    from jobs import reaper

    reaper.watch(ray)
    _started_ray = True
    return True


def stop_ray() -> None:
    """Stop the local Ray this process started (if it still runs)."""
    global _started_ray
    if _started_ray:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _started_ray = False


def _run_ray(spec: JobSpec, pool, call: Call, units: list[Unit], on_result: Callable, failed: dict,
             clock: Clock, keep: bool) -> dict:
    """Feed each actor as soon as it is placed: a free slot (an actor with fewer than
    `IN_FLIGHT` units) takes the next unit, so each result costs O(1) bookkeeping."""
    import ray
    from ray.exceptions import RayError

    from jobs.preflight import _autoscaling

    need = "1 GPU and 1 CPU" if pool.key.gpu else "1 CPU"
    placement = pools.Placement(pool, need, _autoscaling, lambda line: print(f"pooljobs: {line}", file=sys.stderr,
                                                                             flush=True))
    pings = {a.ready.remote(): a for a in pool.pending}
    joins = {}  # ref -> actor: each placed actor's join (model load and warm-up), read for the report at the end
    infos = []
    slots: deque = deque()  # one entry per free place in an actor's queue
    if pool.placed:  # a warm pool
        clock.mark("actors_placed", 0.0)
    for actor in pool.placed:
        joins[actor.join.remote(call)] = actor
        slots.extend([actor] * IN_FLIGHT)
    attempts: Counter = Counter()
    queue = deque(units)
    inflight: dict = {}
    t = time.perf_counter()
    try:
        while queue or inflight:
            while queue and slots:
                actor = slots.popleft()
                unit = queue.popleft()
                inflight[actor.run.remote(call, unit)] = (unit, actor)
            waiting = [*inflight, *pings]
            if not waiting:
                raise pools.PlacementError("every worker was dropped before it could take a unit")
            ready, _ = ray.wait(waiting, num_returns=1, timeout=pools.PROGRESS_SECONDS if pings else None)
            for ref in ready:
                if ref in pings:
                    actor = pings.pop(ref)
                    placement.placed(actor)
                    if len(pool.placed) == 1:
                        clock.mark("actors_placed", time.perf_counter() - pool.created)
                    joins[actor.join.remote(call)] = actor
                    slots.extend([actor] * IN_FLIGHT)
                    continue
                unit, actor = inflight.pop(ref)
                slots.append(actor)
                try:
                    on_result(ray.get(ref))
                except RayError as e:  # task errors, dead actors, lost objects or nodes
                    cause = getattr(e, "cause", None)  # the worker's own exception, for task errors
                    _settle(unit, cause if isinstance(cause, Exception) else e, attempts, spec, failed, queue)
            if pings:
                dropped = placement.poll()
                for ref in [r for r, a in pings.items() if a in dropped]:
                    del pings[ref]
        run_seconds, ended = time.perf_counter() - t, time.time()
        placement.unplaced_at_end()
        for ref in joins:  # done by now: each actor's first unit waited for its join
            try:
                infos.append(ray.get(ref))
            except RayError:
                continue  # that actor's units failed the same way and were settled there
        if infos:  # the steady run starts when the first worker had loaded and warmed up
            run_seconds = min(run_seconds, max(0.0, ended - min(i["joined_at"] for i in infos)))
        if infos:
            for phase in ("model_load", "compile", "warm_up_seconds"):
                if phase in infos[0]:
                    clock.mark(phase.removesuffix("_seconds"), infos[0][phase])
        return {"workers": infos, "run_seconds": run_seconds}
    finally:
        if keep:  # the actors stay: close this call's runners on them
            for actor in pool.placed:
                actor.leave.remote(call.id)


def build_report(units: list[Unit], records, failed: dict, wall: float, ran: set[str]) -> dict:
    """Totals over every committed unit (`records` streamed once, in any order); rates
    over the units this run did (`ran`)."""
    planned = {u.name for u in units}
    totals = Counter()
    now = Counter()
    stages = Counter()
    per_worker: dict[str, Counter] = {}
    refused: dict[str, str] = {}  # why a unit's previous shards were not used -> the first such unit
    for r in records:
        if r["name"] not in planned:
            continue
        totals.update(units_committed=1, rows=r["rows"], tokens=r["tokens"], padded=r["padded_tokens"],
                      errors=r["errors"], truncated=r["truncated"], duplicates=r.get("duplicate_ids", 0),
                      computed=r.get("computed", 0), deduplicated=r.get("deduplicated", 0), reused=r.get("reused", 0))
        if r.get("reuse_refused"):
            refused.setdefault(r["reuse_refused"], r["name"])
        if r["name"] in ran:
            now.update(units=1, rows=r["rows"], tokens=r["tokens"])
        stages.update({k: r["seconds"].get(k, 0.0) for k in ("read", "tokenize", "wait_tokens", "forward", "write", "commit")})
        w = per_worker.setdefault(r["worker"], Counter())
        w.update(units=1, rows=r["rows"], tokens=r["tokens"], forward_seconds=r["seconds"]["forward"])
    workers = {}
    for name, w in per_worker.items():
        workers[name] = {**w, "forward_seconds": float(w["forward_seconds"]),
                         "tokens_per_s_forward": w["tokens"] / w["forward_seconds"] if w["forward_seconds"] else None}
    unit_file = {u.name: u.uri for u in units if u.name in failed}
    return {
        "units": len(units), "units_committed": totals["units_committed"], "units_run_now": now["units"],
        "units_failed": [{"unit": n, "file": unit_file[n], "error": e} for n, e in sorted(failed.items())],
        "rows": totals["rows"], "rows_quarantined": totals["errors"], "tokens": totals["tokens"],
        "rows_truncated": totals["truncated"], "duplicate_ids_within_units": totals["duplicates"],
        "rows_computed": totals["computed"], "rows_deduplicated": totals["deduplicated"], "rows_reused": totals["reused"],
        "reuse_refused": [{"unit": unit, "why": why} for why, unit in refused.items()],
        "padding_efficiency": totals["tokens"] / totals["padded"] if totals["padded"] else None,
        "wall_seconds": wall, "rows_per_s": now["rows"] / wall, "tokens_per_s": now["tokens"] / wall,
        "stage_seconds": {k: float(stages[k]) for k in ("read", "tokenize", "wait_tokens", "forward", "write", "commit")},
        "per_worker": workers,
    }
