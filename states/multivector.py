"""Per-token (ColBERT-style) vectors, as sentence-transformers' `MultiVectorEncoder` gives
documents: every token's last hidden state through the token modules (the projection
`Dense`, `Normalize`) in the saved order, less the tokens `MultiVectorMask` drops for the
document side (its skiplist words, resolved to single vocabulary ids the way
`MultiVectorMask.resolve_with_tokenizer` does; its `keep_only_token_ids` allowlist).
Special tokens stay, as they do there.

`ColbertVectors` is BGE-M3's ColBERT output (FlagEmbedding's definition; see the class).

The kept vectors of each row are scattered into a `Ragged` (B, longest row, D) on the
device, so no step waits for a count.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from states.modules import Normalize, load_linear
from states.pipeline import ModuleSpec
from states.ragged import Ragged


def skiplist_ids(mask: ModuleSpec | None, tokenizer) -> list[int]:
    """Token ids a document's vectors leave out, per the MultiVectorMask config."""
    if mask is None or "document" not in (mask.config.get("skiplist_tasks") or ["document"]):
        return []
    ids = []
    for word in mask.config.get("skiplist_words") or []:
        token_id = tokenizer.convert_tokens_to_ids(word)
        # A word that is not one vocabulary token maps to [UNK]; sentence-transformers drops
        # it rather than dropping every real [UNK].
        if token_id != tokenizer.unk_token_id or word == tokenizer.unk_token:
            ids.append(token_id)
    return ids


class TokenVectors(nn.Module):
    drop_first = False  # whether each row's first token ([CLS]) has no vector

    def __init__(self, modules: list[nn.Module], skip: list[int], keep_only: list[int] | None = None) -> None:
        super().__init__()
        self.modules_ = nn.ModuleList(modules)
        self.register_buffer("skip", torch.tensor(skip, dtype=torch.int64), persistent=False)
        self.register_buffer("keep_only", None if keep_only is None else torch.tensor(keep_only, dtype=torch.int64),
                             persistent=False)

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                max_len: int) -> Ragged:
        """hidden (T, H), input_ids (T,), cu_seqlens (B+1,) -> Ragged (B, max_len, D) float32."""
        x = hidden.float()
        for module in self.modules_:
            x = module(x)  # (T, D)
        keep = ~torch.isin(input_ids, self.skip)  # (T,)
        if self.keep_only is not None:
            keep &= torch.isin(input_ids, self.keep_only)
        starts = cu_seqlens[:-1].long()
        if self.drop_first:
            keep[starts] = False
        rows = starts.numel()
        seg = torch.repeat_interleave(torch.arange(rows, device=x.device), (cu_seqlens[1:] - cu_seqlens[:-1]).long(),
                                      output_size=x.shape[0])  # (T,)
        kept_before = keep.long().cumsum(0) - keep.long()  # (T,) kept tokens before each token in the pack
        position = kept_before - kept_before[starts][seg]  # (T,) its place among its row's kept tokens
        position = torch.where(keep, position, max_len)  # dropped tokens land in a spare slot
        out = torch.zeros(rows, max_len + 1, x.shape[1], device=x.device)  # (B, max_len + 1, D)
        out[seg, position] = x
        lengths = torch.zeros(rows, dtype=torch.int64, device=x.device).index_add_(0, seg, keep.long())
        return Ragged(out[:, :max_len], lengths)

    def settings(self) -> dict:
        """What determines the vectors (the job's provenance)."""
        return {"modules": [type(m).__name__ for m in self.modules_], "skiplist_ids": self.skip.tolist()}


class ColbertVectors(TokenVectors):
    """BGE-M3's ColBERT vectors, as FlagEmbedding computes them in
    FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py (`_colbert_embedding`, then
    `F.normalize` under `normalize_embeddings`) and keeps them in
    FlagEmbedding/inference/embedder/encoder_only/m3.py (`_process_colbert_vecs`: a row's
    `tokens - 1` vectors): colbert_linear on every token's last hidden state but the row's
    first (<s>, the CLS), EOS included, L2-normalized when `normalize`."""

    drop_first = True

    def __init__(self, path: Path, hidden_size: int, normalize: bool) -> None:
        super().__init__([load_linear(path, hidden_size), *([Normalize({})] if normalize else [])], skip=[])
        self.normalize = normalize

    def settings(self) -> dict:
        return {"semantics": "bge-m3", "head": "colbert_linear.pt", "normalize": self.normalize,
                "first_token": "left out"}
