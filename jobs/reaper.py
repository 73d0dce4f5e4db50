"""A watcher that stops a local Ray's processes when the process that started it dies.

Ray ties its GCS and raylet to the driver that starts them, but the raylet's own children
(`DashboardAgent`, `RuntimeEnvAgent`, idle workers) can outlive a driver killed with
`kill -9`. `watch(ray)` starts `python -m jobs.reaper DRIVER_PID ROOT_PID...` in a session
of its own: every `POLL_SECONDS` it notes the processes under the roots (the processes Ray
started for this driver) with their start times; when the driver is gone it terminates
the ones it noted that still run (the same pid and start time, so a reused pid is never
hit), waits `GRACE_SECONDS`, kills what is left, and prints what it stopped to Ray's log
folder. It exits on its own once Ray's processes are all gone (`ray.shutdown()`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_SECONDS = 0.5
GRACE_SECONDS = 3.0


def watch(ray) -> subprocess.Popen:
    """Start the watcher for the local Ray this process just started."""
    node = ray._private.worker._global_node
    roots = [info.process.pid for infos in node.all_processes.values() for info in infos if info.process]
    log = os.path.join(node.get_logs_dir_path(), "pooljobs_reaper.log")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "jobs.reaper", str(os.getpid()), *map(str, roots)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
                os.path.abspath(__file__))), os.environ.get("PYTHONPATH")]))},
        )


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(driver: int, driver_started: float, roots: list[int]) -> list[str]:
    """Watch until the driver dies (then stop what Ray left: returns its descriptions) or
    until Ray's processes are gone by themselves (returns [])."""
    import psutil

    seen: dict[int, tuple[float, str]] = {}  # pid -> (start time, name)
    me = os.getpid()
    while True:
        for root in roots:
            try:
                top = psutil.Process(root)
                found = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for p in found:
                try:
                    if p.pid != me:
                        seen.setdefault(p.pid, (p.create_time(), p.name()))
                except psutil.Error:
                    pass
        if not _alive(driver, driver_started):
            break
        if seen and not any(_alive(pid, t) for pid, (t, _) in seen.items()):
            return []
        time.sleep(POLL_SECONDS)
    left = {pid: v for pid, v in seen.items() if _alive(pid, v[0])}
    for pid in left:
        try:
            psutil.Process(pid).terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline and any(_alive(pid, t) for pid, (t, _) in left.items()):
        time.sleep(0.1)
    for pid, (t, _) in left.items():
        if _alive(pid, t):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
    return [f"{name} (pid {pid})" for pid, (_, name) in sorted(left.items())]


def main(argv: list[str]) -> int:
    import psutil

    driver, roots = int(argv[0]), [int(a) for a in argv[1:]]
    try:
        driver_started = psutil.Process(driver).create_time()
    except psutil.Error:
        driver_started = -1.0
    stopped = reap(driver, driver_started, roots)
    if stopped:
        print(f"pooljobs reaper: driver {driver} died; stopped {', '.join(stopped)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
