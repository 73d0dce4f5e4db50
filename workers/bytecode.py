"""Compiled bytecode for pooljobs' own processes, where the interpreter writes none.

Where `PYTHONDONTWRITEBYTECODE` is set (common in container images, and on the GPU host)
and the installed packages ship little bytecode, every process compiles torch's and
transformers' sources again: most of a cold job's import time (bench/RESULTS.md). The job's
entrypoints (the CLI, a worker actor) then keep bytecode of their own under
`cache_root()/pycache`, never beside the packages' sources:

- `use()` points the interpreter at that folder (`sys.pycache_prefix`), once an earlier job
  filled it, and lets it add the modules still missing there;
- `fill_later()`, in a process that found it unfilled, compiles the modules it imported
  into it from a detached, low-priority process, so the job itself takes no longer.

Why not point the first job at the empty folder: with a prefix, the interpreter ignores
the `__pycache__` folders that do exist beside the sources, and would compile everything.
Bytecode is checked against its source's size and mtime at import, as without a prefix,
so an upgraded package is compiled again, never served stale. `POOLJOBS_PYCACHE=0` turns
this off; where the interpreter writes bytecode itself, nothing changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from states.files import cache_root

_FILL = """
import os, py_compile, sys
root, listing, marker = sys.argv[1:4]
sys.pycache_prefix = root
try:
    os.nice(10)
except OSError:
    pass
with open(listing) as f:
    sources = f.read().splitlines()
for source in sources:
    try:
        py_compile.compile(source, doraise=False, quiet=2)
    except OSError:  # gone since, or unreadable: imported from source as before
        pass
os.remove(listing)
with open(marker, "w") as f:
    f.write(str(len(sources)))
"""


_filling = False  # whether this process started a fill


def root() -> Path:
    return cache_root() / "pycache"


def _marker() -> Path:
    """Filled once for this interpreter (its cache tag and installation)."""
    return root() / f".filled-{sys.implementation.cache_tag}-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}"


def wanted() -> bool:
    """Whether this process would otherwise compile every import anew."""
    return os.environ.get("POOLJOBS_PYCACHE", "1") != "0" and sys.dont_write_bytecode and sys.pycache_prefix is None


def use() -> bool:
    """Import from (and write to) pooljobs' bytecode folder from now on, if an earlier job
    filled it; call before the heavy imports. True when it did."""
    if not wanted() or not _marker().exists():
        return False
    sys.pycache_prefix = str(root())
    sys.dont_write_bytecode = False  # only into the prefix: the packages' folders stay as they are
    return True


def fill_later() -> None:
    """Where `use()` found nothing to use, start filling the folder with the modules this
    process imported (a detached process, once per process; a failure only means the next
    job fills it)."""
    global _filling
    if _filling or not wanted() or _marker().exists():
        return
    _filling = True
    sources = sorted({m.__file__ for m in list(sys.modules.values())
                      if isinstance(getattr(m, "__file__", None), str) and m.__file__.endswith(".py")
                      and os.path.isabs(m.__file__)})
    try:
        root().mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=root(), prefix=".sources-", delete=False) as listing:
            listing.write("\n".join(sources))
        subprocess.Popen([sys.executable, "-c", _FILL, str(root()), listing.name, str(_marker())],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    except OSError:
        return
