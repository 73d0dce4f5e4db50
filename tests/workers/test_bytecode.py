"""pooljobs' own bytecode folder, for interpreters that write none (`workers.bytecode`):
a first process fills it after the fact, later ones import from it, and nothing happens
where the interpreter caches bytecode itself or the switch is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
from workers import bytecode
used = bytecode.use()
import csv  # a module imported after use(): from the folder once it is filled
bytecode.fill_later()
print(json.dumps({"used": used, "prefix": sys.pycache_prefix, "cached": getattr(sys.modules["csv"], "__cached__", None)}))
"""


def _probe(cache: Path, **env: str) -> dict:
    environ = {**os.environ, "POOLJOBS_CACHE": str(cache), "PYTHONPATH": str(REPO), **env}
    environ.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_first_process_fills_the_folder_and_the_next_imports_from_it(tmp_path):
    first = _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert not first["used"] and first["prefix"] is None
    folder = tmp_path / "pycache"
    deadline = time.time() + 60
    while not list(folder.glob(".filled-*")) and time.time() < deadline:  # the detached fill
        time.sleep(0.2)
    assert list(folder.glob(".filled-*")), "the fill never finished"
    assert not list(folder.glob(".sources-*"))  # its list of sources is removed
    second = _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert second["used"] and second["prefix"] == str(folder)
    cached = Path(second["cached"])
    assert cached.is_relative_to(folder) and cached.exists()  # csv's bytecode, from the folder


def test_nothing_changes_where_bytecode_is_written_or_the_switch_is_off(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    writes = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                            env={**environ, "POOLJOBS_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)})
    assert not json.loads(writes.stdout)["used"]
    off = _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1", POOLJOBS_PYCACHE="0")
    assert not off["used"] and off["prefix"] is None
    time.sleep(1)
    assert not (tmp_path / "pycache").exists()  # no fill started either time
