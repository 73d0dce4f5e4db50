"""Loading a model directory: clear `ModelLoadError`s for what cannot be loaded safely,
and the sentence-transformers settings an export carries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_reference import make_pack, random_ids
from states.loading import ModelLoadError, check_model_dir, fingerprint, read_sentence_settings
from states.runtime import ModelOptions, Runtime


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=lambda _, names: [n for n in names if n in skip])
    return dst


def _runtime(path: Path, **options) -> Runtime:
    return Runtime(ModelOptions(model=str(path), device="cpu", dtype="float32", **options))


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a directory .*local model directories only"):
        _runtime(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelLoadError, match="is not a directory"):
        check_model_dir(tmp_path / "file", allow_pickle=False)


def test_missing_config(tiny_model, tmp_path):
    path = _copy(tiny_model("bert"), tmp_path / "m", skip=("config.json",))
    with pytest.raises(ModelLoadError, match=r"has no config\.json; is it a transformers model directory\?"):
        _runtime(path)


def test_no_weights(tiny_model, tmp_path):
    path = _copy(tiny_model("bert"), tmp_path / "m", skip=("model.safetensors",))
    with pytest.raises(ModelLoadError, match=r"holds no weights \(looked for .*model\.safetensors.*pytorch_model\.bin"):
        _runtime(path)


def _pickle_only(tiny_model, tmp_path) -> Path:
    path = _copy(tiny_model("bert"), tmp_path / "m", skip=("model.safetensors",))
    torch.save(load_file(tiny_model("bert") / "model.safetensors"), path / "pytorch_model.bin")
    return path


def test_pickle_weights_refused(tiny_model, tmp_path):
    path = _pickle_only(tiny_model, tmp_path)
    with pytest.raises(ModelLoadError, match=r"only pickle weights \(pytorch_model\.bin\).*--allow-pickle"):
        _runtime(path)


def test_pickle_weights_allowed(tiny_model, tmp_path):
    """With allow_pickle the .bin loads, and computes what the safetensors copy does."""
    path = _pickle_only(tiny_model, tmp_path)
    pack = make_pack(random_ids([1, 8, 20], 1000, 30522, seed=0))
    got = _runtime(path, allow_pickle=True).compute(pack)["embedding"]
    want = _runtime(tiny_model("bert")).compute(pack)["embedding"]
    torch.testing.assert_close(got, want)


def test_safetensors_preferred_over_pickle(tiny_model, tmp_path):
    """Both present: the safetensors are used even without allow_pickle."""
    path = _copy(tiny_model("bert"), tmp_path / "m")
    (path / "pytorch_model.bin").write_bytes(b"not a pickle")
    assert check_model_dir(path, allow_pickle=False) == path
    _runtime(path)


def test_unknown_architecture(tiny_model, tmp_path):
    path = _copy(tiny_model("bert"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "pooljobs-unknown"}))
    with pytest.raises(ModelLoadError, match="cannot load .*for task 'embed'"):
        _runtime(path)


def test_remote_code_refused(tiny_model, tmp_path):
    path = _copy(tiny_model("bert"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="pooljobs-remote", auto_map={"AutoConfig": "configuration_x.XConfig",
                                                          "AutoModel": "modeling_x.XModel"})
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="needs custom code; pass --trust-remote-code"):
        _runtime(path)


def test_missing_tokenizer(tiny_model, tmp_path):
    path = _copy(tiny_model("roberta"), tmp_path / "m", skip=("tokenizer.json", "tokenizer_config.json"))
    with pytest.raises(ModelLoadError, match=r"has no tokenizer \(looked for .*tokenizer\.json"):
        _runtime(path)


def test_fingerprint_names_the_weights(tiny_model, tmp_path):
    path = _copy(tiny_model("bert"), tmp_path / "m")
    before = fingerprint(path)
    (path / "README.md").write_text("docs do not change the model")
    assert fingerprint(path) == before
    weights = load_file(path / "model.safetensors")
    from safetensors.torch import save_file

    name = next(iter(weights))
    weights[name] = weights[name] + 1
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(path) != before


# -- sentence-transformers settings ------------------------------------------------
def _with_st_files(src: Path, dst: Path, pooling: dict, normalize: bool, extra: dict | None = None) -> Path:
    path = _copy(src, dst)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    for name, content in (extra or {}).items():
        (path / name).write_text(json.dumps(content))
    return path


def test_sentence_transformers_settings(tiny_model, tmp_path):
    path = _with_st_files(
        tiny_model("bert"), tmp_path / "m", {"pooling_mode_weightedmean_tokens": True}, normalize=True,
        extra={"sentence_bert_config.json": {"max_seq_length": 32},
               "config_sentence_transformers.json": {"prompts": {"query": "query: ", "doc": ""},
                                                     "default_prompt_name": "query"}},
    )
    runtime = _runtime(path)
    resolved = (runtime.pooling, runtime.normalize, runtime.max_length, runtime.prompt)
    assert resolved == ("weighted_mean", True, 32, "query: ")
    assert _runtime(path, pooling="max", normalize=False, prompt_name="doc").provenance()["pooling"] == "max"
    with pytest.raises(ValueError, match=r"prompt_name='passage' is not among the model's prompts \['doc', 'query'\]"):
        _runtime(path, prompt_name="passage")
    with pytest.raises(ValueError, match="max_length=64 exceeds what the model takes"):
        _runtime(path, max_length=64)


def test_no_sentence_transformers_files(tiny_model):
    assert read_sentence_settings(tiny_model("bert")).pooling is None
    runtime = _runtime(tiny_model("bert"))
    assert (runtime.pooling, runtime.normalize, runtime.prompt) == ("cls", False, "")


def test_several_pooling_modes_refused(tiny_model, tmp_path):
    path = _with_st_files(tiny_model("bert"), tmp_path / "m",
                          {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, normalize=False)
    with pytest.raises(ModelLoadError, match=r"enables \['cls', 'mean'\]; pooljobs supports exactly one"):
        read_sentence_settings(path)
