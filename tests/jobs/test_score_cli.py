"""`python -m jobs.score`: classify and pair scoring write label/probs/logits and score."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from jobs.cli import main
from tests.jobs.fixtures_models import LABELS, save_tiny_bert

TEXTS = ["a short one", "a somewhat longer text about engineers", "", "x y z"]
PAIRS = ["query one", "what is ray", "empty left side", "zz"]


def _reference(model_dir, pairs=None):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    enc = tok(TEXTS, pairs, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.numpy()


def test_classify_and_score(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(4)), "text": TEXTS, "doc": PAIRS}), src)
    cls_model = save_tiny_bert(tmp_path / "cls", head="classify")
    argv = ["--input", str(src), "--output", str(tmp_path / "c"), "--model", str(cls_model), "--id-column", "id",
            "--device", "cpu", "--backend", "local", "--no-progress"]
    assert main("jobs.score", "", ("classify", "score"), argv, {"task": "classify"}) == 0
    out = pq.read_table(tmp_path / "c")
    logits = np.stack(out.column("logits").to_numpy(zero_copy_only=False))
    want = _reference(cls_model)
    np.testing.assert_allclose(logits, want, atol=1e-5)
    assert out.column("label").to_pylist() == [LABELS["classify"][i] for i in want.argmax(1)]
    probs = np.stack(out.column("probs").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)

    ce_model = save_tiny_bert(tmp_path / "ce", head="score")
    argv = ["--input", str(src), "--output", str(tmp_path / "s"), "--model", str(ce_model), "--id-column", "id",
            "--task", "score", "--pair-column", "doc", "--device", "cpu", "--backend", "local", "--no-progress"]
    assert main("jobs.score", "", ("classify", "score"), argv, {"task": "classify"}) == 0
    score = pq.read_table(tmp_path / "s").column("score").to_numpy()
    want = _reference(ce_model, PAIRS)[:, 0]
    np.testing.assert_allclose(score, 1 / (1 + np.exp(-want)), atol=1e-5)
