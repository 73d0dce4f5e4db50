"""Loading a model directory: clear `ModelLoadError`s for what cannot be loaded safely,
hub ids from the local cache, the model's identity, and the sentence-transformers
settings an export carries."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_reference import make_pack, random_ids
from states.loading import ModelLoadError, check_model_dir, fingerprint, resolve_model
from states.pipeline import read_pipeline
from states.runtime import ModelOptions, Runtime


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=lambda _, names: [n for n in names if n in skip])
    return dst


def _runtime(path: Path, **options) -> Runtime:
    return Runtime(ModelOptions(model=str(path), device="cpu", dtype="float32", **options))


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a directory .*local model directories, or hub ids"):
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
    with pytest.raises(ModelLoadError, match=r"has no tokenizer vocabulary \(looked for .*tokenizer\.json"):
        _runtime(path)


def test_tokenizer_config_alone_refused(minilm_path, tmp_path):
    """Only tokenizer_config.json: transformers would build a 5-token vocabulary."""
    path = _copy(minilm_path, tmp_path / "m", skip=("tokenizer.json", "vocab.txt", "special_tokens_map.json"))
    with pytest.raises(ModelLoadError, match="has no tokenizer vocabulary"):
        _runtime(path)


def test_tokenizer_that_knows_no_english_refused(tiny_model, tmp_path):
    """A vocabulary file is there, but it maps ordinary English to the unknown token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = _copy(tiny_model("roberta"), tmp_path / "m", skip=("tokenizer.json",))
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", *[f"x{i}" for i in range(123)]])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>").save_pretrained(path)
    with pytest.raises(ModelLoadError, match=r"maps 100% of an ordinary English sentence to its unknown token"):
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


def _st_model(tiny_model, path: Path, **kwargs) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as m

    torch.manual_seed(0)
    SentenceTransformer(modules=[m.Transformer(str(tiny_model("bert")), max_seq_length=32),
                                 m.Pooling(32, "weightedmean"), m.Dense(32, 8), m.Normalize()], **kwargs).save(str(path))
    return path


@pytest.mark.parametrize("edit", ["tokenizer.json", "tokenizer_config.json", "1_Pooling/config.json",
                                  "2_Dense/config.json", "2_Dense/model.safetensors", "modules.json",
                                  "sentence_bert_config.json", "config_sentence_transformers.json"])
def test_fingerprint_covers_what_changes_outputs(tiny_model, tmp_path, edit):
    """Every tokenizer file and every sentence-transformers module file is the model."""
    path = _st_model(tiny_model, tmp_path / "m")
    before = fingerprint(path)
    with (path / edit).open("ab") as f:
        f.write(b" ")
    assert fingerprint(path) != before


# -- hub ids, from the local cache only ------------------------------------------------
def _cache_snapshot(src: Path, cache: Path, repo: str, revision: str = "main") -> Path:
    """The layout huggingface_hub keeps a downloaded snapshot in (refs/<revision> names the commit)."""
    commit = "0123456789abcdef0123456789abcdef01234567" if revision == "main" else "f" * 40
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(src, root / "snapshots" / commit)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return root / "snapshots" / commit


def test_hub_id_resolves_in_the_local_cache(tiny_model, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main = _cache_snapshot(tiny_model("bert"), tmp_path / "hub", "pooljobs/tiny-bert")
    other = _cache_snapshot(tiny_model("roberta"), tmp_path / "hub", "pooljobs/tiny-bert", revision="v2")
    assert resolve_model("pooljobs/tiny-bert") == main
    assert resolve_model("pooljobs/tiny-bert", revision="v2") == other
    runtime = _runtime("pooljobs/tiny-bert")
    assert runtime.model_dir == main and runtime.state.config.model_type == "bert"
    assert _runtime("pooljobs/tiny-bert", revision="v2").state.config.model_type == "roberta"


def test_hub_id_missing_from_the_cache_names_it(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelLoadError, match=r"BAAI/bge-small-en-v1.5 is not in the local Hugging Face cache \(.*hub"):
        resolve_model("BAAI/bge-small-en-v1.5")
    with pytest.raises(ModelLoadError, match="revision='v1' applies to hub ids"):
        resolve_model(tmp_path, revision="v1")


# -- sentence-transformers settings ------------------------------------------------
def test_sentence_transformers_settings(tiny_model, tmp_path):
    path = _st_model(tiny_model, tmp_path / "m", prompts={"query": "query: ", "doc": ""}, default_prompt_name="query")
    pipeline = read_pipeline(path)
    assert (pipeline.pooling, [m.kind for m in pipeline.post]) == (("weightedmean",), ["Dense", "Normalize"])
    runtime = _runtime(path)
    resolved = (runtime.pooling, runtime.normalize, runtime.max_length, runtime.prompt)
    assert resolved == (("weightedmean",), True, 32, "query: ")
    assert _runtime(path, pooling="max", normalize=False, prompt_name="doc").provenance()["pooling"] == "max"
    with pytest.raises(ValueError, match=r"prompt_name='passage' is not among the model's prompts \['doc', 'document'"):
        _runtime(path, prompt_name="passage")
    with pytest.raises(ValueError, match="max_length=64 exceeds what the model takes"):
        _runtime(path, max_length=64)


def test_no_sentence_transformers_files(tiny_model):
    assert not read_pipeline(tiny_model("bert")).sentence_transformers
    runtime = _runtime(tiny_model("bert"))
    assert (runtime.pooling, runtime.normalize, runtime.prompt) == (("cls",), False, "")


# -- the fingerprint's cache -------------------------------------------------------------
def test_fingerprint_cached_by_file_stats(tiny_model, tmp_path, monkeypatch):
    """A second fingerprint of unchanged files reads no weights; a rewrite of the same size
    with its mtime put back still changes the ctime, so the files are hashed again."""
    import states.files as files

    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_SECONDS", 0)
    path = _copy(tiny_model("bert"), tmp_path / "m")
    first = fingerprint(path)
    assert list((tmp_path / "cache" / "fingerprints").glob("*.json"))
    hashed = []
    real = files._hash_files
    monkeypatch.setattr(files, "_hash_files", lambda *a: hashed.append(a) or real(*a))
    assert fingerprint(path) == first and not hashed
    assert fingerprint(path, cached=False) == first and len(hashed) == 1  # jobs.verify's reading of every byte
    weights = path / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    time.sleep(0.05)  # past the timestamp tick of the copy (the racy rule's case, switched off here)
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size and weights.stat().st_mtime_ns == st.st_mtime_ns
    assert fingerprint(path) != first and len(hashed) == 2


def test_fingerprint_not_cached_while_files_are_fresh(tiny_model, tmp_path, monkeypatch):
    """Files changed within `RACY_SECONDS` may change again inside one timestamp tick."""
    import states.files as files

    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_SECONDS", 3600)
    path = _copy(tiny_model("bert"), tmp_path / "m")
    fingerprint(path)
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_fingerprint_without_a_writable_cache(tiny_model, tmp_path, monkeypatch):
    import states.files as files

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "file"))
    monkeypatch.setattr(files, "RACY_SECONDS", 0)
    path = _copy(tiny_model("bert"), tmp_path / "m")
    assert fingerprint(path) == fingerprint(path, cached=False)


def test_fingerprint_cache_keeps_the_newest(tiny_model, tmp_path, monkeypatch):
    import states.files as files

    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_SECONDS", 0)
    monkeypatch.setattr(files, "MAX_CACHED", 2)
    paths = [_copy(tiny_model("bert"), tmp_path / f"m{i}", skip=("model.safetensors",)) for i in range(3)]
    for path in paths:
        fingerprint(path)
        time.sleep(0.01)
    kept = sorted((tmp_path / "cache" / "fingerprints").glob("*.json"))
    assert len(kept) == 2 and files._cache_file(paths[0]) not in kept


# -- no random initialisation of what the checkpoint holds -------------------------------
_RANDOM_FILLS = {"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                 "random_", "randn", "rand", "randint", "randperm"}


class _RandomFills:
    """Counts the elements written by random-number ops on real (non-meta) tensors."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        fills = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                if name in _RANDOM_FILLS and isinstance(out, torch.Tensor) and out.device.type != "meta":
                    fills.elements += out.numel()
                return out

        self.elements = 0
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


@pytest.mark.parametrize("arch,head", [("bert", "embed"), ("bert", "classify"), ("qwen3", "embed")])
def test_checkpoint_weights_are_not_initialised_first(tiny_model, arch, head):
    """Loading writes each checkpoint tensor once: no random init of the whole model
    first (seconds for BERT-base on a CPU), and the loaded values are the checkpoint's."""
    from safetensors.torch import load_file as read

    from states.loading import load_model

    path = tiny_model(arch, head)
    with _RandomFills() as fills:
        model = load_model(path, "embed" if head == "embed" else head, torch.float32, torch.device("cpu"))
    assert fills.elements == 0
    saved = read(path / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items() if k in state)
    assert sum(k in state for k in saved) >= len(saved) - 1  # a tied head may be saved once


def test_random_fills_are_seen():
    """The counter sees a model built the ordinary way (random init)."""
    from transformers import BertConfig, BertModel

    with _RandomFills() as fills:
        BertModel(BertConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=16))
    assert fills.elements > 64 * 8
