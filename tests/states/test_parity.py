"""Every execution path of every state against the plain transformers reference.

`Runtime.compute(pack)` (packed varlen attention, or the state's padded forward) must
match a separately loaded eager model run on a right-padded batch with an attention
mask, pooled by hand, to cosine >= 0.99999 in fp32 -- for several seeds and lengths from
1 to the model's maximum. The tiny models' wide initialization makes attention matter:
attending across sequence boundaries, dropping the causal mask or the sliding window, or
shifting RoBERTa's positions all push the cosine far below the bar.
"""

from __future__ import annotations

import pytest
import torch

from hf_reference import (
    DEFAULT_POOLING, assert_close, load_reference, make_pack, random_ids, random_texts, reference_hidden,
    reference_logits, reference_pool, tokenized,
)
from states.runtime import ModelOptions, Runtime

PATHS = ["packed", "padded"]
SEEDS = (0, 1, 2)
KIND = {
    "bert": "encoder_only", "roberta": "encoder_only", "xlm-roberta": "encoder_only", "distilbert": "encoder_only",
    "modernbert": "encoder_only", "electra": "encoder_only", "deberta-v2": "encoder_only", "mpnet": "encoder_only",
    "t5": "encoder_decoder", "mt5": "encoder_decoder", "mamba": "hybrid_or_attention_free",
    "qwen3": "decoder", "llama": "decoder", "mistral": "decoder",
}
# No transformers attention-interface support (relative positions, T5 bias, recurrence): padded only.
PADDED_ONLY = {"deberta-v2", "mpnet", "t5", "mt5", "mamba"}
FIRST_ID = {"bert": 1000, "distilbert": 1000, "electra": 1000, "deberta-v2": 1000,
            "t5": 3, "mt5": 3, "mamba": 3, "qwen3": 3, "llama": 3, "mistral": 3}


def _runtime(tiny_model, arch: str, execution: str, head: str = "embed", **extra) -> Runtime:
    path = tiny_model(arch, head)
    return Runtime(ModelOptions(model=str(path), task=head, device="cpu", dtype="float32", execution=execution, **extra))


def _lengths(seed: int, max_len: int) -> list[int]:
    """1 and the maximum always, plus a few in between (ModernBERT's and Mistral's
    windows are 8, so most sequences reach past them)."""
    g = torch.Generator().manual_seed(1000 + seed)
    middle = torch.randint(2, max_len, (4,), generator=g).tolist()
    return [1, *middle, max_len]


def _pair_types(seq: torch.Tensor) -> torch.Tensor:
    """Type 0 for the first half, 1 for the rest (as a text pair would have them)."""
    types = torch.zeros_like(seq)
    types[len(seq) // 2 + 1 :] = 1
    return types


def _check_embeddings(runtime: Runtime, reference, arch: str, mode: str) -> None:
    vocab = runtime.state.config.vocab_size
    with_types = "token_type_ids" in runtime.tokenizer.model_input_names
    for seed in SEEDS:
        ids = random_ids(_lengths(seed, runtime.max_length), FIRST_ID.get(arch, 5), vocab, seed)
        types = [_pair_types(s) for s in ids] if with_types else None
        got = runtime.compute(make_pack(ids, types))["embedding"]  # (B, H)
        want = torch.stack([reference_pool(h, mode) for h in reference_hidden(reference, ids, types)])
        assert_close(got, want)


@pytest.mark.parametrize("execution", PATHS)
@pytest.mark.parametrize("arch", list(KIND))
def test_embed_default_pooling(tiny_model, arch, execution):
    if execution == "packed" and arch in PADDED_ONLY:
        with pytest.raises(ValueError, match="execution='packed' is not available"):
            _runtime(tiny_model, arch, execution)
        assert _runtime(tiny_model, arch, "auto").state.execution == "padded"
        return
    runtime = _runtime(tiny_model, arch, execution, normalize=False)
    assert (runtime.state.kind, runtime.state.execution) == (KIND[arch], execution)
    mode = DEFAULT_POOLING[KIND[arch]]
    assert runtime.pooling == (mode,)
    assert runtime.max_length == 64
    _check_embeddings(runtime, load_reference(tiny_model(arch), KIND[arch]), arch, mode)


@pytest.mark.parametrize("execution", PATHS)
@pytest.mark.parametrize("mode", ["cls", "mean", "max", "lasttoken", "mean_sqrt_len_tokens", "weightedmean"])
@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_embed_pooling_modes(tiny_model, arch, mode, execution):
    runtime = _runtime(tiny_model, arch, execution, pooling=mode, normalize=False)
    _check_embeddings(runtime, load_reference(tiny_model(arch), KIND[arch]), arch, mode)


@pytest.mark.parametrize("execution", PATHS)
def test_embed_normalize_and_dim(tiny_model, execution):
    """Matryoshka truncation first, then unit length."""
    runtime = _runtime(tiny_model, "bert", execution, pooling="mean", normalize=True, dim=16)
    ids = random_ids([3, 17, 64], 1000, runtime.state.config.vocab_size, seed=7)
    got = runtime.compute(make_pack(ids))["embedding"]
    hidden = reference_hidden(load_reference(tiny_model("bert"), "encoder_only"), ids, None)
    want = torch.stack([h.mean(0)[:16] for h in hidden])
    assert_close(got, want / want.norm(dim=1, keepdim=True))


HEAD_ARCHS = ["bert", "roberta", "distilbert", "modernbert", "electra", "deberta-v2", "qwen3", "mistral"]


@pytest.mark.parametrize("execution", ["auto", "padded"])
@pytest.mark.parametrize("task", ["classify", "score"])
@pytest.mark.parametrize("arch", HEAD_ARCHS)
def test_heads(tiny_model, arch, task, execution):
    """Sequence-classification logits and probabilities (score: text pairs, with
    token_type_ids where the tokenizer gives them). 'auto' runs the head packed wherever the
    model's attention can run packed: each of these heads reads one token, which
    `states.heads` finds and checks against the model's own padded forward."""
    runtime = _runtime(tiny_model, arch, execution, head=task)
    packed = execution == "auto" and arch not in PADDED_ONLY
    assert runtime.state.execution == ("packed" if packed else "padded")
    assert runtime.provenance()["head"].startswith("packed: " if packed else "padded: ")
    reference = load_reference(tiny_model(arch, task), KIND[arch], head=task)
    for seed in SEEDS:
        texts = random_texts(6, seed)
        pairs = random_texts(6, seed + 100) if task == "score" else None
        ids, types = tokenized(runtime.tokenizer, texts, pairs)
        if task == "score" and arch == "bert":
            assert types is not None and any(t.max() == 1 for t in types)
        out = runtime.compute(make_pack(ids, types))
        logits = reference_logits(reference, ids, types)
        torch.testing.assert_close(out["logits"], logits, rtol=1e-4, atol=1e-5)
        if task == "score":
            torch.testing.assert_close(out["score"], torch.sigmoid(logits[:, 0]))
        else:
            torch.testing.assert_close(out["probs"], torch.softmax(logits, dim=1))
            assert runtime.labels == ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def mean_pooling_head(tiny_model, tmp_path_factory):
    """ModernBERT with `classifier_pooling="mean"`: its head reads every token."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source = tiny_model("modernbert", "classify")
    path = tmp_path_factory.mktemp("mean-head") / "modernbert"
    AutoModelForSequenceClassification.from_pretrained(source, classifier_pooling="mean").save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path


def test_a_head_reading_many_tokens_runs_padded(mean_pooling_head):
    options = dict(model=str(mean_pooling_head), task="classify", device="cpu", dtype="float32")
    runtime = Runtime(ModelOptions(**options))
    assert runtime.state.execution == "padded"
    assert runtime.provenance()["head"].startswith("padded: no packed reading of the head matched its own forward")
    reference = load_reference(mean_pooling_head, "encoder_only", head="classify")
    ids, types = tokenized(runtime.tokenizer, random_texts(6, 0), None)
    torch.testing.assert_close(runtime.compute(make_pack(ids, types))["logits"], reference_logits(reference, ids, types),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"execution='packed': ModernBertForSequenceClassification's head padded: no "
                                         r"packed reading"):
        Runtime(ModelOptions(**options, execution="packed"))


def test_a_wrong_reading_is_refused(tiny_model, monkeypatch):
    """The check can fail: a decoder's `score` read on the first token (not the last)
    does not match its padded forward, so the model runs padded."""
    from states import heads

    wrong = [("score", "first", r[2]) for r in heads.READINGS if r[0] == "score"]
    monkeypatch.setattr(heads, "READINGS", tuple(wrong))
    runtime = _runtime(tiny_model, "qwen3", "auto", head="classify")
    assert runtime.state.execution == "padded"
    assert "tried score (" in runtime.provenance()["head"]
