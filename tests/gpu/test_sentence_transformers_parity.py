"""bf16 jobs on CUDA against `SentenceTransformer.encode` (float32 on the same GPU):
cos >= 0.999 for the real all-MiniLM-L6-v2 and for a Dense pipeline built on it (the
layout of LaBSE, distiluse-*, gtr-t5-*: Dense 384 -> 128 with tanh, then Normalize)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.jobs.fixtures_models import real_minilm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BF16_MIN_COS = 0.999


@pytest.fixture(scope="module")
def dense_pipeline(tmp_path_factory) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    path = tmp_path_factory.mktemp("gpu-st") / "minilm-dense"
    torch.manual_seed(0)
    SentenceTransformer(modules=[Transformer(str(real_minilm())), Pooling(384, "mean"), Dense(384, 128),
                                 Normalize()]).save(str(path))
    return path


@pytest.mark.parametrize("which", ["minilm", "dense"])
def test_bf16_job_matches_sentence_transformers(which, dense_pipeline):
    import jobs
    from jobs.samples import sample_texts
    from sentence_transformers import SentenceTransformer

    path = real_minilm() if which == "minilm" else dense_pipeline
    texts = sample_texts(2000)
    out = jobs.embed(pd.DataFrame({"text": texts}), model=str(path), backend="local", device="cuda", progress=False)
    got = np.stack(out["embedding"].to_numpy()).astype(np.float64)
    want = SentenceTransformer(str(path), device="cuda").encode(texts, batch_size=128).astype(np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    print(f"{which}: min cos {cos.min():.6f}, mean {cos.mean():.6f} over {len(texts)} texts")
    assert cos.min() >= BF16_MIN_COS
