"""The plain transformers reference the states are tested against, built without them.

Packs are assembled here (not by `workers.packing`), the reference model is a separate
instance loaded with eager attention, its input is a right-padded batch with an
attention mask through the model's own forward, and pooling is written out per sequence.
Nothing here imports `states` beyond the `Pack` dataclass.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from states.interface import Pack

# Default pooling of each routed kind, as the design states it (not read from the code).
DEFAULT_POOLING = {
    "encoder_only": "cls", "decoder": "lasttoken", "encoder_decoder": "mean", "hybrid_or_attention_free": "lasttoken",
}
WORDS = "the quick brown fox jumps over a lazy dog and engineers debug ray jobs all day".split()


def random_ids(lengths: list[int], first_id: int, vocab_size: int, seed: int) -> list[torch.Tensor]:
    """One (L_i,) int64 tensor per length, drawn from the non-special ids."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(first_id, vocab_size, (n,), generator=g) for n in lengths]


def random_texts(count: int, seed: int, max_words: int = 12) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(1, max_words + 1, (1,), generator=g))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=g)))
    return out


def make_pack(ids: list[torch.Tensor], types: list[torch.Tensor] | None = None) -> Pack:
    """Sequences back to back, positions restarting at 0 in each."""
    lengths = torch.tensor([len(s) for s in ids])
    cu = torch.zeros(len(ids) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
    return Pack(torch.cat(ids), positions, None if types is None else torch.cat(types), cu, int(lengths.max()))


def tokenized(tokenizer, texts: list[str], pairs: list[str] | None = None):
    """(ids, types or None) per row, through the tokenizer's own unpadded `__call__`."""
    enc = tokenizer(texts, pairs, padding=False, truncation=True)
    ids = [torch.tensor(x, dtype=torch.long) for x in enc["input_ids"]]
    types = [torch.tensor(x, dtype=torch.long) for x in enc["token_type_ids"]] if "token_type_ids" in enc else None
    return ids, types


def padded(ids: list[torch.Tensor], types: list[torch.Tensor] | None, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, L) batch with its attention mask."""
    longest = max(len(s) for s in ids)
    batch = {
        "input_ids": torch.full((len(ids), longest), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(len(ids), longest, dtype=torch.long),
    }
    if types is not None:
        batch["token_type_ids"] = torch.zeros(len(ids), longest, dtype=torch.long)
    for i, seq in enumerate(ids):
        batch["input_ids"][i, : len(seq)] = seq
        batch["attention_mask"][i, : len(seq)] = 1
        if types is not None:
            batch["token_type_ids"][i, : len(seq)] = types[i]
    return batch


def load_reference(model_dir: Path, kind: str, head: str = "embed"):
    """A fresh fp32 eager-attention model: the bare encoder for encoder-decoder models."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTextEncoding

    if head != "embed":
        auto = AutoModelForSequenceClassification
    else:
        auto = AutoModelForTextEncoding if kind == "encoder_decoder" else AutoModel
    return auto.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def reference_hidden(model, ids: list[torch.Tensor], types: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """Last hidden states of each sequence, (L_i, H), from one padded forward."""
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    batch = padded(ids, types, pad_id)
    hidden = model(**batch).last_hidden_state  # (B, L, H)
    return [hidden[i, : len(seq)] for i, seq in enumerate(ids)]


@torch.no_grad()
def reference_logits(model, ids: list[torch.Tensor], types: list[torch.Tensor] | None) -> torch.Tensor:
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return model(**padded(ids, types, pad_id)).logits.float()  # (B, C)


def reference_pool(h: torch.Tensor, mode: str) -> torch.Tensor:
    """One sequence's hidden states (L, H) -> (H,), as sentence-transformers defines the modes."""
    if mode == "cls":
        return h[0]
    if mode == "lasttoken":
        return h[-1]
    if mode == "mean":
        return h.mean(0)
    if mode == "max":
        return h.max(0).values
    if mode == "mean_sqrt_len_tokens":
        return h.sum(0) / len(h) ** 0.5
    if mode == "weightedmean":
        w = torch.arange(1, len(h) + 1, dtype=h.dtype)[:, None]
        return (h * w).sum(0) / w.sum()
    raise AssertionError(mode)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, min_cos: float = 0.99999) -> None:
    """Row-wise cosine >= min_cos and matching norms (cosine alone ignores scale)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    cos = F.cosine_similarity(actual.float(), expected.float(), dim=-1)
    assert float(cos.min()) >= min_cos, f"cosine {cos.tolist()} below {min_cos}"
    torch.testing.assert_close(actual.float().norm(dim=-1), expected.float().norm(dim=-1), rtol=1e-4, atol=1e-5)
