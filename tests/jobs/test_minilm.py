"""The real all-MiniLM-L6-v2 through `jobs.embed` equals sentence-transformers' `encode`."""

import numpy as np
import pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer

from jobs.embed import demo_args
from jobs.cli import main
from jobs.samples import minilm_path, sample_texts


def test_minilm_matches_sentence_transformers(tmp_path):
    argv = demo_args(str(tmp_path)) + ["--backend", "local", "--device", "cpu", "--no-progress"]
    assert main("jobs.embed", "", ("embed",), argv) == 0
    table = pq.read_table(tmp_path / "embeddings", columns=["id", "embedding"]).sort_by("id")
    texts = sample_texts()
    assert table.column("id").to_pylist() == list(range(len(texts)))
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    want = SentenceTransformer(str(minilm_path()), device="cpu").encode(texts, batch_size=64)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, f"min cos {cos.min()} at row {cos.argmin()}"
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the model's Normalize module applies
