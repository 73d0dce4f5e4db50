"""On CUDA: a notebook's second call reuses the loaded, compiled model (no load, no
compile, no warm-up), and compiled kernels persist in pooljobs' Inductor cache folder.
Skipped without CUDA; run on the lent GPU machine (no Ray needed: backend="local")."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def model(tmp_path_factory):
    from transformers import BertConfig, BertModel

    from tests.jobs.fixtures_models import save_tiny_bert

    # A BERT-mini shape with the MiniLM tokenizer: large enough that loading and compiling show.
    path = save_tiny_bert(tmp_path_factory.mktemp("warm") / "m")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024), add_pooling_layer=False).save_pretrained(path)
    return path


def test_second_call_is_warm_and_compiled_kernels_persist(model, tmp_path, monkeypatch):
    import jobs
    from jobs import pool as pools

    from tests.jobs.fixtures_models import count_model_loads

    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    loads = count_model_loads(monkeypatch)
    texts = [f"row {i}: " + "pooling jobs embed rows " * (i % 40) for i in range(4000)]
    df = pd.DataFrame({"text": texts})
    try:
        t = time.perf_counter()
        first = jobs.embed(df, model=model, backend="local", device="cuda", compile="on")
        cold = time.perf_counter() - t
        t = time.perf_counter()
        second = jobs.embed(df, model=model, backend="local", device="cuda", compile="on")
        warm = time.perf_counter() - t
    finally:
        pools.shutdown()
    assert len(loads) == 1
    assert warm < cold, (warm, cold)
    a, b = np.stack(first["embedding"].to_numpy()), np.stack(second["embedding"].to_numpy())
    np.testing.assert_array_equal(a, b)
    from states.compiling import cache_dir

    folder = cache_dir(torch.device("cuda"))
    assert str(folder).startswith(str(tmp_path / "cache")) and any(folder.rglob("*")), "Inductor wrote its cache there"
