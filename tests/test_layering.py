"""The layers import downward only: `workers` never imports `jobs`; `states` imports
neither. And `jobs.embed` / `jobs.score` stay the notebook functions, though modules of
the same names exist."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"workers": {"jobs"}, "states": {"jobs", "workers"}}


def upward_imports(source: str, package: str) -> list[str]:
    """Modules a `package` module's source imports from the layers above it (anywhere
    in the module: top level, functions, `TYPE_CHECKING` blocks; relative imports resolved)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [package if node.level else node.module or ""]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in FORBIDDEN[package]]
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_a_layer_above(package):
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules
    bad = {str(m.relative_to(ROOT)): found for m in modules if (found := upward_imports(m.read_text(), package))}
    assert not bad


@pytest.mark.parametrize("source,package", [
    ("from jobs.spec import JobSpec", "workers"),
    ("import jobs", "workers"),
    ("def f():\n    from jobs import api\n", "workers"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import jobs.spec as s\n", "workers"),
    ("from workers.reader import Unit", "states"),
    ("import jobs.driver, os", "states"),
])
def test_an_upward_import_is_found(source, package):
    assert upward_imports(source, package)


@pytest.mark.parametrize("source,package", [
    ("from states.runtime import Runtime\nimport jobsworth", "workers"),
    ("from .pooling import pool\nimport numpy", "states"),
])
def test_downward_and_lookalike_imports_pass(source, package):
    assert not upward_imports(source, package)


def test_jobs_embed_and_score_stay_functions_after_their_modules_load():
    """`jobs/__init__.py` swaps the package's class so that importing the submodules
    `jobs.embed` and `jobs.score` (the CLI modules) does not hide the notebook functions."""
    code = ("import types, jobs, jobs.embed, jobs.score, sys\n"
            "assert callable(jobs.embed) and not isinstance(jobs.embed, types.ModuleType), jobs.embed\n"
            "assert callable(jobs.score) and not isinstance(jobs.score, types.ModuleType), jobs.score\n"
            "assert isinstance(sys.modules['jobs.embed'], types.ModuleType)\n"
            "assert jobs.embed.__module__ == 'jobs.api' and jobs.classify.__module__ == 'jobs.api'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
