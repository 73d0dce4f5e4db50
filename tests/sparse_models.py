"""Tiny SparseEncoder (SPLADE) and MultiVectorEncoder (ColBERT-style) directories, built with
the installed sentence-transformers' own module classes and `save()`d as a user would, and a
tiny BGE-M3 laid out as BAAI/bge-m3 is (a SentenceTransformer of an XLM-RoBERTa with CLS
pooling and Normalize, plus FlagEmbedding's colbert_linear.pt and sparse_linear.pt) with
`m3_reference`, FlagEmbedding's formulas on a padded transformers forward."""

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



# Text the tiny XLM-R tokenizer is trained on: English, punctuation, accents, CJK, emoji.
_M3_CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Engineers debug Ray jobs all day; and all night!",
    "Ça coûte 5 € — naïve café, straße, 東京は晴れ。",
    "emoji 🙂 and URLs: https://example.com/a?b=c&d=e",
    "Hybrid search mixes dense vectors, lexical weights and late interaction.",
    "pooljobs writes Parquet shards exactly once per input row, with a manifest and a report.",
]


def xlmr_tokenizer(vocab_size: int = 400):
    """An XLM-R tokenizer (SentencePiece Unigram, <s> <pad> </s> <unk> as ids 0-3, <mask> last)
    with a vocabulary trained on `_M3_CORPUS`: characters it never saw are <unk>."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import XLMRobertaTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    words = " ".join(_M3_CORPUS).split()
    texts = _M3_CORPUS + [" ".join(words[i:i + 7]) for i in range(len(words))]
    tok.train_from_iterator(texts, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    vocab = [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]
    return XLMRobertaTokenizerFast(vocab=[*vocab, ("<mask>", 0.0)], model_max_length=64)


def save_m3(directory: Path, colbert_dim: int | None = None, seed: int = 0) -> Path:
    """A random 2-layer XLM-RoBERTa (hidden 32) saved by sentence-transformers with CLS pooling
    and Normalize, and FlagEmbedding's heads written as its `save` writes them:
    `torch.save(linear.state_dict())` of colbert_linear (hidden -> `colbert_dim`, default
    hidden as in bge-m3) and sparse_linear (hidden -> 1)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import XLMRobertaConfig, XLMRobertaModel

    base = directory.with_name(directory.name + "-xlmr")
    tokenizer = xlmr_tokenizer()
    config = XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
                              bos_token_id=0, eos_token_id=2, initializer_range=0.5)
    torch.manual_seed(seed)
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(base)
    tokenizer.save_pretrained(base)
    transformer = Transformer(str(base), max_seq_length=64)
    SentenceTransformer(modules=[transformer, Pooling(32, "cls"), Normalize()], device="cpu").save(str(directory))
    torch.manual_seed(seed + 1)
    colbert_linear = torch.nn.Linear(32, colbert_dim or 32)
    sparse_linear = torch.nn.Linear(32, 1)
    torch.nn.init.normal_(sparse_linear.bias, 0.0, 0.5)  # some tokens weigh 0 (relu), as in a trained head
    torch.save(colbert_linear.state_dict(), directory / "colbert_linear.pt")
    torch.save(sparse_linear.state_dict(), directory / "sparse_linear.pt")
    return directory


def m3_reference(path: Path, texts: list[str], max_length: int = 64, dtype: str = "float32",
                 device: str = "cpu") -> tuple:
    """FlagEmbedding's formulas on a padded transformers forward (`states.reference.bge_m3`,
    the reference `jobs.verify` uses too; independent of pooljobs' packed heads)."""
    from states.reference import bge_m3

    return bge_m3(path, texts, max_length, dtype=dtype, device=device)
