"""SPLADE sparse vectors over the vocabulary, computed on the device from packed states.

`SpladeHead` does what sentence-transformers' `SpladePooling` does to a fill-mask model's
logits (`activation_function` relu: log(1 + relu(x)); log1p_relu: log(1 + log(1 + relu(x)));
then `pooling_strategy` max or sum over each sequence's tokens), with the settings read from
the module's saved config. The MLM head runs on chunks of tokens so a pack never holds
(tokens x vocabulary) logits at once; only (rows x vocabulary) pooled weights live on the
device, and only each row's nonzero (or top-k / above-threshold) weights, sorted by
vocabulary index, go home as `Ragged` outputs `sparse_indices` and `sparse_values`.
"""

from __future__ import annotations

import torch
from torch import nn

from states.errors import ModelLoadError
from states.ragged import Ragged

POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
CHUNK_TOKENS = 2048  # tokens whose logits are computed at once: (CHUNK_TOKENS, vocabulary) float32


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
                         "(sparse output needs one)")


def splade_settings(config: dict) -> tuple[str, str]:
    """(pooling_strategy, activation_function) from a SpladePooling config, checked."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in POOLING_STRATEGIES or activation not in ACTIVATIONS:
        raise ModelLoadError(f"SpladePooling with pooling_strategy={strategy!r}, activation_function={activation!r}: "
                             f"pooljobs runs {POOLING_STRATEGIES} with {ACTIVATIONS}")
    return strategy, activation


class SpladeHead(nn.Module):
    def __init__(self, head: nn.Module, config: dict, top_k: int | None = None, threshold: float | None = None) -> None:
        super().__init__()
        self.head = head
        self.strategy, self.activation = splade_settings(config)
        self.top_k, self.threshold = top_k, threshold

    def _activate(self, logits: torch.Tensor) -> torch.Tensor:
        w = torch.log1p(torch.relu(logits.float()))
        return torch.log1p(w) if self.activation == "log1p_relu" else w

    def weights(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """hidden (T, H), cu_seqlens (B+1,) -> pooled SPLADE weights (B, V) float32, >= 0.

        Both activations are monotone, so the max of the activated logits is the activation
        of the max logit (exactly): with max pooling each chunk only takes a running max of
        the raw logits, in the model's dtype, and the activation runs once on (B, V)."""
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (B,)
        seg = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device), lengths,
                                      output_size=hidden.shape[0])  # (T,)
        pooled = None
        for start in range(0, hidden.shape[0], CHUNK_TOKENS):
            logits = self.head(hidden[start:start + CHUNK_TOKENS])  # (c, V)
            rows = seg[start:start + CHUNK_TOKENS, None]  # (c, 1)
            if self.strategy == "max":
                if pooled is None:
                    pooled = torch.full((lengths.numel(), logits.shape[1]), float("-inf"), dtype=logits.dtype,
                                        device=logits.device)  # (B, V)
                pooled.scatter_reduce_(0, rows.expand_as(logits), logits, reduce="amax")
            else:
                w = self._activate(logits)
                pooled = torch.zeros(lengths.numel(), w.shape[1], device=w.device) if pooled is None else pooled
                pooled.index_add_(0, rows[:, 0], w)
        return self._activate(pooled) if self.strategy == "max" else pooled

    def forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> dict[str, Ragged]:
        """-> `sparse_indices` (int32) and `sparse_values` (float32) per row, by ascending index.

        With `top_k` the kept width is known, so nothing waits for the device; without it
        the widest row's count is read first (one sync per pack)."""
        pooled = self.weights(hidden, cu_seqlens)  # (B, V)
        if self.threshold is not None:
            pooled = torch.where(pooled > self.threshold, pooled, 0.0)
        k = self.top_k or max(1, int((pooled > 0).sum(1).max()))
        values, indices = pooled.topk(min(k, pooled.shape[1]), dim=1)  # (B, K) largest first
        kept = values > 0
        indices = torch.where(kept, indices, pooled.shape[1])  # padding sorts last
        order = indices.argsort(dim=1)
        lengths = kept.sum(1)  # (B,)
        return {"sparse_indices": Ragged(indices.gather(1, order).int(), lengths),
                "sparse_values": Ragged(values.gather(1, order), lengths)}
