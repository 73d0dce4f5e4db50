"""sentence-transformers pipelines saved by the installed sentence-transformers, run by
pooljobs, against `SentenceTransformer.encode` / `CrossEncoder.predict` on the same
directory (CPU fp32: max abs diff <= 1e-4, cosine >= 0.99999).

Each pipeline is built from sentence-transformers' own module classes and `save()`d as a
user would; the older formats are the same saves rewritten into keys sentence-transformers
still reads (its loader is the reference for them too).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import jobs
from hf_reference import random_texts
from states.errors import ModelLoadError
from states.runtime import ModelOptions, Runtime

TEXTS = ["the quick brown fox", "ok", "Engineers DEBUG Ray jobs all day and all night, over and over again.",
         "a lazy dog", "!"] + random_texts(11, seed=3)
H = 32


def _st():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    return SentenceTransformer, modules


def _save(modules: list, path: Path, **kwargs) -> Path:
    SentenceTransformer, _ = _st()
    torch.manual_seed(0)
    SentenceTransformer(modules=modules, **kwargs).save(str(path))
    return path


def _encode(path: Path, texts=TEXTS, **kwargs) -> np.ndarray:
    SentenceTransformer, _ = _st()
    model = SentenceTransformer(str(path), device="cpu")
    return model.encode(texts, convert_to_numpy=True, batch_size=4, **kwargs)


def _embed(path: Path, texts=TEXTS, **options) -> np.ndarray:
    """pooljobs' whole job path, in process."""
    out = jobs.embed(pd.DataFrame({"text": texts}), model=str(path), backend="local", device="cpu", progress=False,
                     **options)
    assert out["error"].isna().all()
    return np.stack(out["embedding"].to_numpy()).astype(np.float32)


def _assert_parity(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max() <= 1e-4, np.abs(got - want).max()
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99999, cos.min()


@pytest.fixture(scope="module")
def tiny_bert(tiny_model) -> str:
    return str(tiny_model("bert"))


def _pipelines(tiny: str) -> dict[str, list]:
    _, m = _st()
    return {
        # The layout of LaBSE, distiluse-*, gtr-t5-*: a Dense projection and Normalize after pooling.
        "dense-tanh-normalize": [m.Transformer(tiny), m.Pooling(H, "mean"), m.Dense(H, 16), m.Normalize()],
        "cls+mean-dense-gelu-nobias-layernorm": [
            m.Transformer(tiny), m.Pooling(H, ("cls", "mean")),
            m.Dense(2 * H, 24, bias=False, activation_function=torch.nn.GELU()), m.LayerNorm(24)],
        "max-dense-identity-residual-dropout": [
            m.Transformer(tiny), m.Pooling(H, "max"), m.Dense(H, H, activation_function=None, use_residual=True),
            m.Dropout(0.3)],
        "weightedmean-dense-residual-projected": [
            m.Transformer(tiny), m.Pooling(H, "weightedmean"), m.Dense(H, 8, use_residual=True), m.Normalize()],
        "lasttoken-lowercase-max-seq-length": [
            m.Transformer(tiny, max_seq_length=12, do_lower_case=True), m.Pooling(H, "lasttoken")],
        "mean-sqrt-len": [m.Transformer(tiny), m.Pooling(H, "mean_sqrt_len_tokens")],
        "weighted-layer-pooling": [
            m.Transformer(tiny, config_kwargs={"output_hidden_states": True}),
            m.WeightedLayerPooling(H, num_hidden_layers=2, layer_start=1,
                                   layer_weights=torch.nn.Parameter(torch.tensor([0.3, 2.0]))),
            m.Pooling(H, "mean")],
    }


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st")
    return {name: _save(mods, root / name) for name, mods in _pipelines(tiny_bert).items()}


@pytest.mark.parametrize("name", ["dense-tanh-normalize", "cls+mean-dense-gelu-nobias-layernorm",
                                  "max-dense-identity-residual-dropout", "weightedmean-dense-residual-projected",
                                  "lasttoken-lowercase-max-seq-length", "mean-sqrt-len", "weighted-layer-pooling"])
def test_pipeline_matches_sentence_transformers(saved, name):
    _assert_parity(_embed(saved[name]), _encode(saved[name]))


def test_dense_changes_the_size_and_is_recorded(saved):
    runtime = Runtime(ModelOptions(model=str(saved["dense-tanh-normalize"]), device="cpu", dtype="float32"))
    assert runtime.output_shapes["embedding"] == (16,) and runtime.normalize
    assert runtime.provenance()["modules"] == "Dense+Normalize"


def test_lowercase_and_max_seq_length_are_the_transformers(saved):
    runtime = Runtime(ModelOptions(model=str(saved["lasttoken-lowercase-max-seq-length"]), device="cpu"))
    assert runtime.max_length == 12 and runtime.pooling == ("lasttoken",)
    assert runtime.tokenizer("DEBUG")["input_ids"] == runtime.tokenizer("debug")["input_ids"]


def test_weighted_layer_pooling_changes_the_output(saved, tiny_bert):
    """The layer weights matter (guards against running the last layer only)."""
    plain = _save(_pipelines(tiny_bert)["mean-sqrt-len"][:1] + [_st()[1].Pooling(H, "mean")],
                  saved["mean-sqrt-len"].parent / "plain-mean")
    assert np.abs(_embed(saved["weighted-layer-pooling"]) - _embed(plain)).max() > 1e-2


def test_prompt_excluded_from_pooling(tiny_bert, tmp_path):
    _, m = _st()
    path = _save([m.Transformer(tiny_bert), m.Pooling(H, "mean", include_prompt=False)], tmp_path / "p",
                 prompts={"query": "query: the lazy dog says ", "document": ""}, default_prompt_name="query")
    got = _embed(path)
    _assert_parity(got, _encode(path, prompt_name="query"))
    runtime = Runtime(ModelOptions(model=str(path), device="cpu"))
    assert runtime.prompt_skip == 7 and runtime.provenance()["include_prompt"] == "False"  # [CLS] + 6 words
    included = _save([m.Transformer(tiny_bert), m.Pooling(H, "mean")], tmp_path / "i",
                     prompts={"query": "query: the lazy dog says "}, default_prompt_name="query")
    assert np.abs(got - _embed(included)).max() > 1e-3  # the prompt's tokens would count


def test_router_routes_by_option(tiny_bert, tmp_path):
    _, m = _st()
    router = m.Router.for_query_document(query_modules=[m.Dense(H, 16)],
                                         document_modules=[m.Dense(H, 16, activation_function=None)])
    path = _save([m.Transformer(tiny_bert), m.Pooling(H, "mean"), router, m.Normalize()], tmp_path / "r")
    query, document = _embed(path, route="query"), _embed(path, route="document")
    _assert_parity(query, _encode(path, task="query"))
    _assert_parity(document, _encode(path, task="document"))
    _assert_parity(_embed(path), _encode(path))  # the Router's default route
    assert np.abs(query - document).max() > 1e-2
    with pytest.raises(ModelLoadError, match=r"route='passage' is not one of \['document', 'query'\]"):
        Runtime(ModelOptions(model=str(path), device="cpu", route="passage"))


# -- formats older sentence-transformers wrote, as the current one still reads them ---------
def _legacy(src: Path, dst: Path) -> Path:
    """The save rewritten in the keys of sentence-transformers 2-5: `sentence_transformers.models.*`
    types, `pooling_mode_*_tokens` flags with `word_embedding_dimension`, max_seq_length and
    do_lower_case in sentence_bert_config.json."""
    shutil.copytree(src, dst)
    modules = json.loads((dst / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    (dst / "modules.json").write_text(json.dumps(modules))
    pooling = json.loads((dst / "1_Pooling" / "config.json").read_text())
    mode = pooling.pop("pooling_mode")
    legacy = {"word_embedding_dimension": pooling.pop("embedding_dimension")}
    for key, name in [("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
                      ("pooling_mode_max_tokens", "max"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
                      ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "lasttoken")]:
        legacy[key] = name in ((mode,) if isinstance(mode, str) else tuple(mode))
    (dst / "1_Pooling" / "config.json").write_text(json.dumps({**legacy, **pooling}))
    (dst / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 20, "do_lower_case": False}))
    return dst


@pytest.mark.parametrize("name", ["dense-tanh-normalize", "cls+mean-dense-gelu-nobias-layernorm"])
def test_legacy_format_matches_sentence_transformers(saved, tmp_path, name):
    path = _legacy(saved[name], tmp_path / name)
    _assert_parity(_embed(path), _encode(path))
    assert Runtime(ModelOptions(model=str(path), device="cpu")).max_length == 20


def test_legacy_pooling_without_a_mode_is_mean(saved, tmp_path):
    path = _legacy(saved["mean-sqrt-len"], tmp_path / "none")
    config = json.loads((path / "1_Pooling" / "config.json").read_text())
    (path / "1_Pooling" / "config.json").write_text(json.dumps({k: (False if k.startswith("pooling_mode") else v)
                                                                for k, v in config.items()}))
    _assert_parity(_embed(path), _encode(path))


# -- what cannot run is refused -------------------------------------------------------
def test_unknown_module_refused(tiny_bert, tmp_path):
    _, m = _st()
    path = _save([m.Transformer(tiny_bert), m.Pooling(H, "mean"), m.Normalize()], tmp_path / "u")
    modules = json.loads((path / "modules.json").read_text())
    modules[2]["type"] = "sentence_transformers.sentence_transformer.modules.cnn.CNN"
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match=r"module type '.*\.CNN' cannot be run by pooljobs"):
        Runtime(ModelOptions(model=str(path), device="cpu"))


def test_static_embedding_refused(tmp_path, minilm_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from transformers import AutoTokenizer

    static = StaticEmbedding(AutoTokenizer.from_pretrained(minilm_path).backend_tokenizer, embedding_dim=8)
    SentenceTransformer(modules=[static]).save(str(tmp_path / "s"))
    with pytest.raises(ModelLoadError, match="StaticEmbedding' cannot be run by pooljobs"):
        Runtime(ModelOptions(model=str(tmp_path / "s"), device="cpu"))


def test_custom_activation_path_refused(saved, tmp_path):
    path = shutil.copytree(saved["dense-tanh-normalize"], tmp_path / "a")
    config = json.loads((path / "2_Dense" / "config.json").read_text())
    (path / "2_Dense" / "config.json").write_text(json.dumps({**config, "activation_function": "os.system"}))
    with pytest.raises(ModelLoadError, match="activation function 'os.system' is not a torch.nn module class"):
        Runtime(ModelOptions(model=str(path), device="cpu"))


def test_module_weights_must_fit(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(saved["dense-tanh-normalize"], tmp_path / "w")
    weights = load_file(path / "2_Dense" / "model.safetensors")
    del weights["linear.bias"]
    save_file(weights, path / "2_Dense" / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"Dense module's weights do not fit its config \(missing \['linear.bias'\]"):
        Runtime(ModelOptions(model=str(path), device="cpu"))


# -- the real model ---------------------------------------------------------------------
def test_real_minilm_matches_sentence_transformers(minilm_path):
    from jobs.samples import sample_texts

    texts = sample_texts(40)
    _assert_parity(_embed(minilm_path, texts), _encode(minilm_path, texts))
