"""SPLADE sparse vectors over the vocabulary, computed on the device from packed states.

`SpladeHead` does what sentence-transformers' `SpladePooling` does to a fill-mask model's
logits (`activation_function` relu: log(1 + relu(x)); log1p_relu: log(1 + log(1 + relu(x)));
then `pooling_strategy` max or sum over each sequence's tokens), with the settings read from
the module's saved config. The MLM head runs on chunks of tokens (`LOGITS_PER_CHUNK` logits
each) so a pack never holds (tokens x vocabulary) logits at once; only (rows x vocabulary) pooled weights live on the
device, and only each row's nonzero (or top-k / above-threshold) weights, sorted by
vocabulary index, go home as `Ragged` outputs `sparse_indices` and `sparse_values`.

`LexicalWeights` is BGE-M3's sparse output (FlagEmbedding's definition; see the class), and
`sparse_head` picks between the two from the model directory's files.
"""

from __future__ import annotations

import torch
from torch import nn

from states.errors import ModelLoadError
from states.interface import Pack
from states.modules import load_linear
from states.pipeline import Pipeline
from states.ragged import Pending, Ragged
from states.segment_max import segment_max_

POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
ID_STRIDE = 1 << 31  # (row, token id) sort keys: row * ID_STRIDE + id
LOGITS_PER_CHUNK = 1 << 27  # logits computed at once (256 MiB in bf16): 4,398 tokens of BERT's vocabulary
VOCAB_ALIGN = 64  # the logits' row length is padded to this many columns (128-byte rows in bf16)


def mlm_head(model: nn.Module) -> nn.Module:
    """The module that turns a fill-mask model's last hidden states into vocabulary logits,
    by the attribute names transformers gives it (BERT `cls`, RoBERTa/XLM-R `lm_head`,
    DistilBERT's vocab_* layers, ModernBERT `head` + `decoder`)."""
    for name in ("cls", "lm_head"):
        if isinstance(getattr(model, name, None), nn.Module):
            return getattr(model, name)
    if hasattr(model, "vocab_projector"):
        return nn.Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)
    if hasattr(model, "decoder") and hasattr(model, "head"):
        return nn.Sequential(model.head, model.decoder)
    raise ModelLoadError(f"{type(model).__name__}: pooljobs finds no masked-language-model head in it "
                         "(sparse output needs one, or BGE-M3's sparse_linear.pt beside the model)")


def splade_settings(config: dict) -> tuple[str, str]:
    """(pooling_strategy, activation_function) from a SpladePooling config, checked."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in POOLING_STRATEGIES or activation not in ACTIVATIONS:
        raise ModelLoadError(f"SpladePooling with pooling_strategy={strategy!r}, activation_function={activation!r}: "
                             f"pooljobs runs {POOLING_STRATEGIES} with {ACTIVATIONS}")
    return strategy, activation


def align_vocabulary(head: nn.Module) -> int:
    """Pads the head's vocabulary projection (its widest `nn.Linear`) in place to a multiple
    of `VOCAB_ALIGN` outputs (zero weights and bias) and returns the true vocabulary size:
    the head's logits then have the first that many columns of rows `VOCAB_ALIGN`-aligned.

    Why: a vocabulary such as BERT's 30,522 makes each logits row 61,044 bytes, which no
    16-byte-aligned GEMM kernel can write, and cuBLAS falls back to kernels several times
    slower; the padded columns are never read."""
    name, linear = max(((n, m) for n, m in head.named_modules() if isinstance(m, nn.Linear)),
                       key=lambda item: item[1].out_features)
    vocab = linear.out_features
    width = -(-vocab // VOCAB_ALIGN) * VOCAB_ALIGN
    if width != vocab:
        padded = nn.Linear(linear.in_features, width, bias=True, device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            padded.weight.zero_()
            padded.bias.zero_()
            padded.weight[:vocab] = linear.weight
            if linear.bias is not None:
                padded.bias[:vocab] = linear.bias
        parent, _, attr = name.rpartition(".")
        setattr(head.get_submodule(parent) if parent else head, attr, padded)
    return vocab


class SpladeHead(nn.Module):
    def __init__(self, head: nn.Module, config: dict, top_k: int | None = None, threshold: float | None = None) -> None:
        super().__init__()
        self.head = head
        self.vocab = align_vocabulary(head)
        self.strategy, self.activation = splade_settings(config)
        self.top_k, self.threshold = top_k, threshold

    def _activate(self, logits: torch.Tensor) -> torch.Tensor:
        w = torch.log1p(torch.relu(logits.float()))
        return torch.log1p(w) if self.activation == "log1p_relu" else w

    def weights(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """hidden (T, H), cu_seqlens (B+1,) -> pooled SPLADE weights (B, V) float32, >= 0.

        Both activations are monotone, so the max of the activated logits is the activation
        of the max logit (exactly): with max pooling each chunk only folds its raw logits
        into a running max per row (`segment_max_`), and the activation runs once on (B, V)."""
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (B,)
        seg = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device, dtype=torch.int32),
                                      lengths, output_size=hidden.shape[0])  # (T,)
        pooled = None
        chunk = max(1, LOGITS_PER_CHUNK // self.vocab)
        for start in range(0, hidden.shape[0], chunk):
            logits = self.head(hidden[start:start + chunk])[:, :self.vocab]  # (c, V), rows padded
            rows = seg[start:start + chunk]  # (c,)
            if self.strategy == "max":
                if pooled is None:
                    pooled = torch.full((lengths.numel(), logits.shape[1]), float("-inf"), device=logits.device)  # (B, V)
                segment_max_(pooled, logits, rows)
            else:
                w = self._activate(logits)
                pooled = torch.zeros(lengths.numel(), w.shape[1], device=w.device) if pooled is None else pooled
                pooled.index_add_(0, rows, w)
        return self._activate(pooled) if self.strategy == "max" else pooled

    def settings(self) -> dict:
        """What determines the values (the job's provenance)."""
        return {"pooling_strategy": self.strategy, "activation": self.activation, "top_k": self.top_k,
                "threshold": self.threshold}

    def forward(self, hidden: torch.Tensor, pack: Pack) -> dict[str, Ragged] | Pending:
        """hidden (T, H) -> `sparse_indices` (int32) and `sparse_values` (float32) per row, by
        ascending index.

        With `top_k` the kept width is known; without it every positive weight is kept, at
        the width of the row with most of them, which only the device knows (`positive`
        returns them `Pending`)."""
        pooled = self.weights(hidden, pack.cu_seqlens)  # (B, V)
        if self.threshold is not None:
            pooled = torch.where(pooled > self.threshold, pooled, 0.0)
        return largest(pooled, self.top_k) if self.top_k else positive(pooled)


def positive(weights: torch.Tensor) -> Pending:
    """weights (B, N) -> every positive weight of each row by ascending column, as Ragged
    `sparse_indices` (int32) and `sparse_values` (float32), like `largest` with k = N; the
    width (the most any row keeps) is the device's, so they come `Pending` on it.

    Why not `largest`: a top-k as wide as the widest row (hundreds to thousands of a trained
    SPLADE model's 30,522 weights) sorts what is already in column order; a running count
    per row places each kept weight in one scatter instead."""
    lengths = (weights > 0).sum(1)  # (B,)

    def finish(most: int) -> dict[str, Ragged]:
        width = max(1, most)
        kept = weights > 0  # (B, N)
        slot = torch.where(kept, kept.cumsum(1) - 1, width)  # (B, N) place in its row; dropped -> the spare column
        columns = torch.arange(weights.shape[1], device=weights.device, dtype=torch.int32).expand_as(weights)
        indices = torch.full((weights.shape[0], width + 1), torch.iinfo(torch.int32).max, dtype=torch.int32,
                             device=weights.device).scatter_(1, slot, columns)
        values = torch.zeros((weights.shape[0], width + 1), device=weights.device).scatter_(1, slot, weights.float())
        return {"sparse_indices": Ragged(indices[:, :width], lengths),
                "sparse_values": Ragged(values[:, :width], lengths)}

    return Pending(lengths.max() if weights.shape[0] else lengths.new_zeros(()), finish)


def largest(weights: torch.Tensor, k: int, ids: torch.Tensor | None = None) -> dict[str, Ragged]:
    """weights (B, N) -> each row's k largest positive weights by ascending id, as Ragged
    `sparse_indices` (int32) and `sparse_values` (float32); ids (B, N) name each weight's
    vocabulary id (None: its column)."""
    values, positions = weights.topk(min(k, weights.shape[1]), dim=1)  # (B, K) largest first
    indices = positions if ids is None else ids.gather(1, positions)
    kept = values > 0
    indices = torch.where(kept, indices, torch.iinfo(torch.int32).max)  # padding sorts last
    order = indices.argsort(dim=1)
    lengths = kept.sum(1)  # (B,)
    return {"sparse_indices": Ragged(indices.gather(1, order).int(), lengths),
            "sparse_values": Ragged(values.gather(1, order), lengths)}


def unused_token_ids(tokenizer) -> list[int]:
    """The ids BGE-M3's sparse output leaves out: the tokenizer's cls, eos, pad and unk tokens
    (those it has)."""
    ids = (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    return sorted({i for i in ids if i is not None})


class LexicalWeights(nn.Module):
    """BGE-M3's sparse output ("lexical weights"), as FlagEmbedding computes it in
    FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py (`_sparse_embedding`) and
    FlagEmbedding/inference/embedder/encoder_only/m3.py (`_process_token_weights`): each
    token's weight relu(sparse_linear(last hidden state)), the largest per vocabulary id over
    a row's tokens, only positive weights kept, the `unused_token_ids` left out (for XLM-R
    <s>, </s>, <pad>, <unk>). `threshold` keeps weights above it and `top_k` each row's k
    largest, as for SPLADE.

    A row holds at most its token count of ids, so the weights are grouped per (row, id) by
    sorting the pack's tokens, never spread over (rows x vocabulary) (XLM-R's vocabulary is
    250k ids), and the pack's longest row bounds the width: no step waits for a count."""

    def __init__(self, linear: nn.Linear, unused: list[int], top_k: int | None = None,
                 threshold: float | None = None) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("unused", torch.tensor(unused, dtype=torch.int64), persistent=False)
        self.top_k, self.threshold = top_k, threshold

    def settings(self) -> dict:
        return {"semantics": "bge-m3", "head": "sparse_linear.pt", "unused_token_ids": self.unused.tolist(),
                "top_k": self.top_k, "threshold": self.threshold}

    def forward(self, hidden: torch.Tensor, pack: Pack) -> dict[str, Ragged]:
        """hidden (T, H) -> `sparse_indices` (int32) and `sparse_values` (float32) per row, by
        ascending index."""
        tokens, rows = hidden.shape[0], pack.num_seqs
        weight = torch.relu(self.linear(hidden.float()))[:, 0]  # (T,)
        floor = 0.0 if self.threshold is None else max(self.threshold, 0.0)
        keep = (weight > floor) & ~torch.isin(pack.input_ids, self.unused)  # (T,)
        seg = torch.repeat_interleave(torch.arange(rows, device=hidden.device),
                                      (pack.cu_seqlens[1:] - pack.cu_seqlens[:-1]).long(), output_size=tokens)  # (T,)
        span = rows * ID_STRIDE  # key of a dropped token: after every kept one
        key, order = torch.where(keep, seg * ID_STRIDE + pack.input_ids, span).sort()  # (T,) by (row, id)
        weight = torch.where(keep, weight, 0.0)[order]
        first = torch.ones_like(keep)
        first[1:] = key[1:] != key[:-1]
        first &= key < span  # (T,) the first token of each kept (row, id)
        group = (first.long().cumsum(0) - 1).clamp(min=0)  # (T,) its (row, id) group, in key order
        best = torch.zeros(tokens, device=hidden.device).scatter_reduce_(0, group, weight, "amax")  # (T,) max per group
        row = torch.where(first, key // ID_STRIDE, rows)  # (T,) dropped into a spare row
        count = torch.zeros(rows + 1, dtype=torch.int64, device=hidden.device).index_add_(0, row, first.long())
        position = torch.where(first, group - (count.cumsum(0) - count)[row], pack.max_len)  # (T,) place in its row
        values = torch.zeros(rows + 1, pack.max_len + 1, device=hidden.device)  # (B + 1, L + 1)
        ids = torch.zeros(rows + 1, pack.max_len + 1, dtype=torch.int64, device=hidden.device)
        values[row, position] = best[group]
        ids[row, position] = key % ID_STRIDE
        return largest(values[:rows, :pack.max_len], self.top_k or pack.max_len, ids[:rows, :pack.max_len])


def sparse_head(model: nn.Module, pipeline: Pipeline, tokenizer, top_k: int | None,
                threshold: float | None) -> SpladeHead | LexicalWeights:
    """The sparse output's head: BGE-M3's lexical weights where the directory has
    sparse_linear.pt (`model` is then the bare encoder), else SPLADE over the fill-mask
    `model`'s MLM head with the SpladePooling settings (sentence-transformers' defaults when
    the directory has none)."""
    if pipeline.m3_sparse is not None:
        linear = load_linear(pipeline.m3_sparse, model.config.hidden_size, 1)
        return LexicalWeights(linear, unused_token_ids(tokenizer), top_k, threshold)
    return SpladeHead(mlm_head(model), pipeline.splade.config if pipeline.splade else {}, top_k, threshold)
