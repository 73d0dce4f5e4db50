"""`Runtime` end to end: a real sentence-transformers model, resolved limits and options,
and what a pooling forward must not keep around."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hf_reference import assert_close, load_reference, make_pack, random_ids, reference_hidden, tokenized
from states.runtime import ModelOptions, Runtime

TEXTS = [
    "A man is playing a guitar.",
    "ok",
    "The new movie is awesome, and the popcorn was fine too, though the seats were a little cramped.",
    "Ray actors each own one GPU and stream Arrow batches through the model.",
    "!",
]


def _runtime(path, **options) -> Runtime:
    return Runtime(ModelOptions(model=str(path), device="cpu", dtype="float32", **options))


@pytest.fixture(scope="module")
def minilm_embeddings(minilm_path) -> torch.Tensor:
    """all-MiniLM-L6-v2 through sentence-transformers itself: mean pooling + Normalize."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path), device="cpu")
    return model.encode(TEXTS, convert_to_tensor=True).float()


@pytest.mark.parametrize("execution", ["packed", "padded"])
def test_sentence_transformers_model(minilm_path, minilm_embeddings, execution):
    runtime = _runtime(minilm_path, execution=execution)
    assert (runtime.pooling, runtime.normalize, runtime.max_length) == (("mean",), True, 256)
    ids, types = tokenized(runtime.tokenizer, TEXTS)
    got = runtime.compute(make_pack(ids, types))["embedding"]
    assert_close(got, minilm_embeddings)


@pytest.mark.parametrize("arch", ["roberta", "mpnet"])
def test_max_length_leaves_reserved_positions(tiny_model, tmp_path, arch):
    """RoBERTa-style embeddings start positions at padding_idx + 1: with a tokenizer that
    sets no limit, a 66-row position table takes 64 tokens, and 64 tokens run."""
    path = shutil.copytree(tiny_model(arch), tmp_path / arch)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("model_max_length", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    runtime = _runtime(path)
    assert runtime.max_length == 64
    ids = random_ids([1, 64], 5, 128, seed=0)
    got = runtime.compute(make_pack(ids))["embedding"]
    want = torch.stack([h[0] for h in reference_hidden(load_reference(tiny_model(arch), "encoder_only"), ids, None)])
    assert_close(got, want)
    with pytest.raises(ValueError, match=r"max_length=65 exceeds what the model takes \(64\)"):
        _runtime(path, max_length=65)


@pytest.mark.parametrize("arch, execution", [("qwen3", "packed"), ("qwen3", "padded"), ("mamba", "padded")])
def test_no_cache_is_built(tiny_model, arch, execution):
    """A pooling forward never decodes on: decoders must not fill a KV / SSM cache."""
    runtime = _runtime(tiny_model(arch), execution=execution)
    outputs = []
    runtime.state.model.register_forward_hook(lambda module, args, out: outputs.append(out))
    runtime.compute(make_pack(random_ids([5, 9], 3, 128, seed=0)))
    assert outputs
    for name in ("cache", "past_key_values", "cache_params"):
        assert all(getattr(o, name, None) is None for o in outputs), name


def test_provenance_names_the_resolved_settings(tiny_model):
    runtime = _runtime(tiny_model("qwen3"), dim=8, normalize=True)
    assert runtime.provenance() | {"model": ""} == {
        "model": "", "task": "embed", "state": "decoder", "execution": "packed", "pooling": "lasttoken",
        "normalize": "True", "dim": "8", "dtype": "float32", "max_length": "64", "prompt": "",
        "compiled": "False", "gelu_epilogue": "False", "outputs": "dense",  # compile=auto compiles on CUDA only
    }
    assert runtime.compute(make_pack(random_ids([4], 3, 128, seed=0)))["embedding"].shape == (1, 8)


@pytest.mark.parametrize("dtype, exact_gelu, fused", [
    ("bfloat16", False, True), ("bfloat16", True, False), ("float32", False, False),
], ids=["bf16", "bf16-exact-gelu", "fp32"])
def test_compiled_bert_runs_gelu_in_the_epilogue_only_in_half_precision(tiny_model, dtype, exact_gelu, fused):
    """Half-precision compiled blocks run BERT's linear + GELU as `linear_gelu`; --exact-gelu
    and fp32 (reference) runs keep Inductor's exact GELU. Counted in a forward, not in the
    pass: Inductor's caches skip the pass when the graph is cached."""
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    runtime = Runtime(ModelOptions(model=str(tiny_model("bert")), device="cpu", dtype=dtype, compile="on",
                                   exact_gelu=exact_gelu))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runtime.compute(make_pack(random_ids([5, 9], 3, 128, seed=0)))
    calls = sum(e.count for e in prof.key_averages() if e.key == "pooljobs::linear_gelu")
    assert runtime.compiled and (calls > 0) == fused and runtime.provenance()["gelu_epilogue"] == str(fused)


@pytest.mark.parametrize("options, message", [
    ({"pooling": "last_token"}, r"pooling='last_token' is not a pooling mode; choose one of \('cls'"),
    ({"dtype": "fp8"}, r"dtype='fp8'; choose one of \['auto', 'float32', 'float16', 'bfloat16'\]"),
    ({"execution": "fast"}, r"execution='fast'; choose one of \('auto', 'packed', 'padded'\)"),
    ({"state": "causal"}, r"state='causal' is not a known state"),
    ({"compile": "yes"}, r"compile='yes'; choose one of \('auto', 'on', 'off'\)"),
])
def test_bad_options(tiny_model, options, message):
    with pytest.raises(ValueError, match=message):
        Runtime(ModelOptions(model=str(tiny_model("bert")), device="cpu", **options))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(tiny_model):
    with pytest.raises(ValueError, match="CUDA is not available here"):
        Runtime(ModelOptions(model=str(tiny_model("bert")), device="cuda"))


def test_dim_larger_than_model_errors(tiny_model):
    """At load: the warm-up forward already pools and truncates."""
    with pytest.raises(ValueError, match="dim=33 exceeds the model's embedding size 32"):
        _runtime(tiny_model("bert"), dim=33)
