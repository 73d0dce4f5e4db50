"""pooljobs' version, written once: in pyproject.toml.

Read from the source tree's pyproject.toml when the package runs from a checkout (so a
worktree's own version wins over an editable install of another), else from the installed
distribution's metadata.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _read() -> str:
    if _PYPROJECT.is_file():
        found = re.search(r'^version\s*=\s*"([^"]+)"', _PYPROJECT.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    try:
        return version("pooljobs")
    except PackageNotFoundError as e:
        raise RuntimeError("pooljobs' version: no pyproject.toml beside the package and no installed metadata") from e


VERSION = _read()
