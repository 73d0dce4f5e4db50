"""Heads: cross-encoders saved by sentence-transformers score as `CrossEncoder.predict`,
and weights a checkpoint lacks (a head, a pooler) stop the load instead of running random."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import jobs
from hf_reference import random_texts
from states.errors import ModelLoadError
from states.runtime import ModelOptions, Runtime

PAIRS = list(zip(random_texts(12, seed=1), random_texts(12, seed=2)))


def _cross_encoder(tiny_model, tmp_path, activation):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_model("bert", "score")), activation_fn=activation, device="cpu")
    model.save(str(tmp_path / "ce"))
    return tmp_path / "ce"


def _score(path, **options) -> pd.DataFrame:
    data = pd.DataFrame({"text": [a for a, _ in PAIRS], "pair": [b for _, b in PAIRS]})
    out = jobs.score(data, model=str(path), pair_column="pair", backend="local", device="cpu", progress=False,
                     **options)
    assert out["error"].isna().all()
    return out


@pytest.mark.parametrize("activation", [None, torch.nn.Tanh(), torch.nn.Identity()], ids=["default", "tanh", "identity"])
def test_cross_encoder_score_is_predict(tiny_model, tmp_path, activation):
    from sentence_transformers import CrossEncoder

    path = _cross_encoder(tiny_model, tmp_path, activation)
    reference = CrossEncoder(str(path), device="cpu")
    out = _score(path)
    np.testing.assert_allclose(out["score"].to_numpy(), reference.predict(PAIRS), atol=1e-5)
    logits = np.stack(out["logits"].to_numpy())[:, 0]
    np.testing.assert_allclose(logits, reference.predict(PAIRS, activation_fn=torch.nn.Identity()), atol=1e-5)


def test_cross_encoder_activation_in_older_configs(tiny_model, tmp_path):
    """sentence-transformers 4-5 kept activation_fn in config.json's `sentence_transformers`."""
    from sentence_transformers import CrossEncoder

    path = _cross_encoder(tiny_model, tmp_path, torch.nn.Tanh())
    st = json.loads((path / "config_sentence_transformers.json").read_text())
    activation = st.pop("activation_fn")
    (path / "config_sentence_transformers.json").write_text(json.dumps(st))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "sentence_transformers": {"activation_fn": activation}}))
    np.testing.assert_allclose(_score(path)["score"].to_numpy(), CrossEncoder(str(path), device="cpu").predict(PAIRS),
                               atol=1e-5)


def test_headless_classify_refused(tiny_model):
    with pytest.raises(ModelLoadError, match=r"task 'classify' needs weights the checkpoint does not have \(it has no "
                                             r"classification head.*classifier\.weight"):
        Runtime(ModelOptions(model=str(tiny_model("bert")), task="classify", device="cpu"))


def test_headless_classify_exits_2(tiny_model, tmp_path, capsys):
    from jobs.cli import main

    pq.write_table(pa.table({"text": ["a b", "c"]}), tmp_path / "in.parquet")
    code = main("jobs.score", "score", ("classify", "score"), [
        "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--model", str(tiny_model("bert")),
        "--backend", "local", "--device", "cpu", "--task", "classify"])
    assert code == 2  # refused by the preflight, from the checkpoint's tensor names, before the model loads
    err = capsys.readouterr().err
    assert "task 'classify' needs a sequence-classification head" in err and "holds no head weights" in err


def test_missing_weights_allowed_explicitly(tiny_model):
    runtime = Runtime(ModelOptions(model=str(tiny_model("bert")), task="classify", device="cpu",
                                   allow_missing_weights=True))
    assert runtime.output_shapes["probs"] == (2,)


def test_missing_encoder_weights_refused_for_embed(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(tiny_model("bert"), tmp_path / "m")
    weights = load_file(path / "model.safetensors")
    name = next(k for k in weights if "layer.1.attention" in k)
    del weights[name]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=f"task 'embed' needs weights .*{name.split('.', 1)[-1]}"):
        Runtime(ModelOptions(model=str(path), device="cpu"))



def test_missing_pooler_is_harmless_only_for_embeddings(tiny_model, tmp_path):
    """An embedding forward takes the last hidden state; a classification head reads the pooler."""
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(tiny_model("bert", "classify"), tmp_path / "m")
    weights = load_file(path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".pooler." not in k}, path / "model.safetensors",
              metadata={"format": "pt"})
    Runtime(ModelOptions(model=str(path), device="cpu"))
    with pytest.raises(ModelLoadError, match=r"task 'classify' needs weights .*bert\.pooler\.dense\.bias"):
        Runtime(ModelOptions(model=str(path), task="classify", device="cpu"))
