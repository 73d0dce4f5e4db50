"""`states.preflight.check`: the front door's early refusal, from small files only, agreeing
with what the full load (`Runtime`) finds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from states.errors import ModelLoadError
from states.options import ModelOptions
from states.preflight import check
from states.runtime import Runtime


@pytest.fixture(scope="module")
def dense_model(tiny_model, tmp_path_factory) -> Path:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as m

    path = tmp_path_factory.mktemp("preflight") / "dense"
    torch.manual_seed(0)
    SentenceTransformer(modules=[m.Transformer(str(tiny_model("bert")), max_seq_length=48),
                                 m.Pooling(32, ("cls", "mean")), m.Dense(64, 16), m.Normalize()]).save(str(path))
    return path


@pytest.mark.parametrize("arch", ["bert", "roberta", "mpnet", "distilbert", "qwen3", "t5"])
def test_facts_agree_with_the_load(tiny_model, arch):
    options = ModelOptions(model=str(tiny_model(arch)), device="cpu")
    facts, runtime = check(options), Runtime(options)
    assert (facts.max_length, (facts.embedding_size,)) == (runtime.max_length, runtime.output_shapes["embedding"])


def test_dense_pipeline_facts(dense_model):
    facts = check(ModelOptions(model=str(dense_model)))
    runtime = Runtime(ModelOptions(model=str(dense_model), device="cpu"))
    assert (facts.embedding_size, facts.max_length) == (16, 48) == (runtime.output_shapes["embedding"][0],
                                                                    runtime.max_length)


@pytest.mark.parametrize("options, message", [
    ({"dim": 17}, "dim=17 exceeds the model's embedding size 16"),
    ({"max_length": 49}, r"max_length=49 exceeds what the model takes \(48\)"),
    ({"task": "classify"}, "task 'classify' needs a sequence-classification head, and the checkpoint holds no head"),
    ({"task": "score"}, "task 'score' needs a sequence-classification head"),
    ({"route": "query"}, "route='query' but .* has no Router module"),
])
def test_refusals(dense_model, options, message):
    with pytest.raises(ModelLoadError, match=message):
        check(ModelOptions(model=str(dense_model), **options))


def test_heads_pass(tiny_model):
    for head in ("classify", "score"):
        check(ModelOptions(model=str(tiny_model("bert", head)), task=head))
        check(ModelOptions(model=str(tiny_model("qwen3", head)), task=head))


def test_unknown_module_refused(dense_model, tmp_path):
    path = shutil.copytree(dense_model, tmp_path / "m")
    modules = json.loads((path / "modules.json").read_text())
    modules[2]["type"] = "sentence_transformers.models.LSTM"
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="module type 'sentence_transformers.models.LSTM' cannot be run"):
        check(ModelOptions(model=str(path)))


def test_unusable_tokenizer_refused(minilm_path, tmp_path):
    path = shutil.copytree(minilm_path, tmp_path / "m", ignore=shutil.ignore_patterns("tokenizer.json", "vocab.txt"))
    with pytest.raises(ModelLoadError, match="has no tokenizer vocabulary"):
        check(ModelOptions(model=str(path)))


def test_reads_no_weights_and_imports_no_torch(dense_model):
    code = ("import sys; from states.preflight import check; from states.options import ModelOptions; "
            f"check(ModelOptions(model={str(dense_model)!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
