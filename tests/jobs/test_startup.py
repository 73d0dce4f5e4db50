"""What a job's start-up does not do: import Ray for a local run's device check. Run in a
fresh interpreter, since the test session itself imports Ray."""

from __future__ import annotations

import os
import subprocess
import sys

from jobs.driver import REPO_ROOT

DEVICE_CHECK = """
import sys, torch
torch.cuda.is_available = lambda: True  # one GPU here, as on the GPU host
torch.cuda.device_count = lambda: 1
from jobs.preflight import check_device
from jobs.spec import JobSpec
check_device(JobSpec(input="x.parquet", output="out", model="m", device="cuda"))
print("ray imported:", "ray" in sys.modules)
"""


def test_local_device_check_imports_no_ray():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", DEVICE_CHECK], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ray imported: False" in done.stdout
