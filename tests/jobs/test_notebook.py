"""`examples/batch_scoring.ipynb` runs top to bottom in a fresh kernel and prints what it should.

The kernel is `python3`: jupyter_client runs a spec whose command is `python` with this
interpreter, and falls back to ipykernel's own spec when none is installed. It gets the
repository on PYTHONPATH, a tiny classifier through POOLJOBS_TINY_CLASSIFIER, and TMPDIR
under the test's tmp_path, so the notebook's staging and output dirs are cleaned up.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from jobs.driver import REPO_ROOT
from tests.jobs.fixtures_models import LABELS
from tests.jobs.fixtures_models import save_tiny_bert as tiny_bert

NOTEBOOK = REPO_ROOT / "examples" / "batch_scoring.ipynb"


def test_notebook_runs(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("POOLJOBS_TINY_CLASSIFIER", str(tiny_bert(tmp_path / "classifier", "classify")))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    stdout = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "embeddings (200, 384) errors 0" in stdout
    assert re.search(r"nearest: row \d+, cosine 0\.\d{3}:", stdout)
    labels = ast.literal_eval(re.search(r"labels (\{.*\})", stdout).group(1))
    assert set(labels) <= set(LABELS["classify"]) and sum(labels.values()) == 200
    assert "shards 4 rows 200" in stdout
    assert any("image/png" in o.get("data", {}) for o in outputs), "the report plot is displayed"
    staged = [p.name for p in (tmp_path / "tmp").iterdir() if re.fullmatch(r"pooljobs-[0-9a-f]{16,32}", p.name)]
    assert not staged, "the API removes its staging dirs"
