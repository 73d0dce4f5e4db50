"""Classification and cross-encoder heads run packed in bf16 on CUDA: the load-time check
(`states.heads`) must accept the head at bf16 tolerance, and the logits of a job's
default settings must match transformers' own fp32 padded forward on the same GPU (relative
error <= 2%, same top class on >= 99% of rows). Models of a BERT-small and a Qwen3 shape
with transformers' default initialisation, the WordPiece files of all-MiniLM-L6-v2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.jobs.fixtures_models import real_minilm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024, vocab_size=30522)


def _save(path: Path, arch: str, labels: int) -> Path:
    from transformers import BertConfig, BertForSequenceClassification, Qwen3Config, Qwen3ForSequenceClassification

    torch.manual_seed(labels)
    if arch == "bert":
        model = BertForSequenceClassification(BertConfig(**SHAPE, num_labels=labels))
    else:
        model = Qwen3ForSequenceClassification(Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=64,
                                                           num_labels=labels, pad_token_id=0))
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(real_minilm() / name, path / name)
    return path


@pytest.mark.parametrize("labels", [3, 1], ids=["classify", "score"])
@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_bf16_packed_head_matches_fp32_padded(tmp_path, arch, labels):
    from jobs.samples import sample_texts
    from states.runtime import ModelOptions, Runtime
    from transformers import AutoModelForSequenceClassification
    from tests.states.hf_reference import make_pack, padded, tokenized

    path = _save(tmp_path / arch, arch, labels)
    task = "classify" if labels > 1 else "score"
    runtime = Runtime(ModelOptions(model=str(path), task=task, device="cuda"))
    assert runtime.dtype == torch.bfloat16
    assert runtime.state.execution == "packed", runtime.provenance()["head"]
    texts = sample_texts(256)
    pairs = texts[1:] + texts[:1] if task == "score" else None
    ids, types = tokenized(runtime.tokenizer, texts, pairs)
    got = runtime.compute(make_pack(ids, types).to("cuda"))["logits"].float()
    reference = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).cuda().eval()
    batch = {k: v.cuda() for k, v in padded(ids, types, reference.config.pad_token_id or 0).items()}
    with torch.inference_mode():
        want = reference(**batch).logits.float()
    error = float((got - want).norm() / want.norm())
    print(f"{arch} {task}: relative error {error:.2e}, {runtime.provenance()['head']}")
    assert error <= 0.02
    if labels > 1:
        assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.99
