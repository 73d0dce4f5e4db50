"""Tiny SparseEncoder (SPLADE) and MultiVectorEncoder (ColBERT-style) directories, built with
the installed sentence-transformers' own module classes and `save()`d as a user would."""

from __future__ import annotations

import shutil
import string
from pathlib import Path

from tests.jobs.fixtures_models import real_minilm

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _tiny_bert(directory: Path, masked_lm: bool, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32; with its fill-mask head when `masked_lm`) and
    all-MiniLM-L6-v2's real tokenizer."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertModel

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(seed)
    (BertForMaskedLM if masked_lm else BertModel)(config).eval().save_pretrained(directory)
    source = real_minilm()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, directory / name)
    return directory


def save_splade(directory: Path, pooling_strategy: str = "max", activation: str = "relu") -> Path:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    base = _tiny_bert(directory.with_name(directory.name + "-mlm"), masked_lm=True)
    modules = [Transformer(str(base), transformer_task="fill-mask"), SpladePooling(pooling_strategy, activation)]
    SparseEncoder(modules=modules, device="cpu").save(str(directory))
    return directory


def save_colbert(directory: Path, normalize: bool = False) -> Path:
    import torch
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    base = _tiny_bert(directory.with_name(directory.name + "-base"), masked_lm=False)
    torch.manual_seed(1)
    modules = [Transformer(str(base)),
               Dense(32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings",
                     module_output_name="token_embeddings")]
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    modules.append(MultiVectorMask(skiplist_words=list(string.punctuation)))
    MultiVectorEncoder(modules=modules, device="cpu").save(str(directory))
    return directory

