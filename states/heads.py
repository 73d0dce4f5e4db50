"""Sequence-classification heads run on packed hidden states.

A transformers sequence-classification model is a base model plus a head that reads one
token of each sequence's last hidden states: the first (BERT's pooler, the RoBERTa,
ELECTRA and MPNet classification heads, DistilBERT's pre-classifier, ModernBERT's `cls`
head) or the last (decoders' `score`). Run packed, the base model gives every token's
hidden state (T, H) at embedding speed, and the head then needs only those tokens, as a
(B, 1, H) batch of one-token sequences: what it reads from the padded batch.

Which head a model has is neither looked up by class nor by model type (the lesson of
vLLM PR #52425): `find_head` tries each way of calling the model's own head modules
(`READINGS`) on probe sequences and keeps the first whose logits equal the model's own
padded forward. None equal means the model runs padded, and the reason is kept; so a head
that reads more than one token (ModernBERT's `mean` pooling, say) never runs packed by
mistake, and a new architecture is either verified or runs as transformers runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

Token = Literal["first", "last"]
# Relative L2 error of packed logits against the padded forward a reading may have: the two
# differ only by attention kernels (bf16 varlen against SDPA); a wrong reading is off by O(1).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}
PROBE_LENGTHS = (1, 7, 3, 12)


def _dropout(model: nn.Module, *names: str) -> nn.Module:
    """The model's dropout before its classifier (identity in eval mode), by its names."""
    return next((getattr(model, n) for n in names if isinstance(getattr(model, n, None), nn.Module)), nn.Identity())


# (name, token read, logits (B, C) from the model, its base model and the tokens (B, 1, H))
READINGS: tuple[tuple[str, Token, Callable[[nn.Module, nn.Module, torch.Tensor], torch.Tensor]], ...] = (
    ("pooler, classifier", "first", lambda m, base, s: m.classifier(_dropout(m, "dropout")(base.pooler(s)))),
    ("classification head", "first", lambda m, base, s: m.classifier(s)),
    ("pre-classifier, classifier", "first",
     lambda m, base, s: m.classifier(_dropout(m, "dropout")(torch.relu(m.pre_classifier(s[:, 0]))))),
    ("head, classifier", "first", lambda m, base, s: m.classifier(_dropout(m, "drop", "dropout")(m.head(s[:, 0])))),
    ("score", "last", lambda m, base, s: m.score(s)[:, 0]),
)


@dataclass(frozen=True)
class PackedHead:
    """One verified reading of a model's head: `logits(model, hidden, cu_seqlens)`."""

    name: str
    token: Token
    read: Callable[[nn.Module, nn.Module, torch.Tensor], torch.Tensor]

    def logits(self, model: nn.Module, base: nn.Module, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """hidden (T, H) packed (`base`'s output), cu_seqlens (B+1,) -> logits (B, C)."""
        at = cu_seqlens[:-1] if self.token == "first" else cu_seqlens[1:] - 1
        return self.read(model, base, hidden[at.long()][:, None, :])


def base_of(model: nn.Module) -> nn.Module | None:
    """The base model inside a model with a head (transformers names it by
    `base_model_prefix`: `bert`, `roberta`, `model`, ...), or None for a bare base model."""
    base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
    return base if isinstance(base, nn.Module) and base is not model else None


def probe_ids(vocab: int, avoid: set[int]) -> list[list[int]]:
    """Fixed token ids of `PROBE_LENGTHS` sequences, none of them in `avoid` (the pad id:
    a decoder's padded forward finds each sequence's last token by it)."""
    g = torch.Generator().manual_seed(0)
    allowed = next(i for i in range(vocab) if i not in avoid)
    ids = [allowed if i in avoid else i for i in torch.randint(0, vocab, (sum(PROBE_LENGTHS),), generator=g).tolist()]
    out, start = [], 0
    for n in PROBE_LENGTHS:
        out.append(ids[start:start + n])
        start += n
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-6))


def find_head(model: nn.Module, base: nn.Module, packed_hidden: Callable[[], torch.Tensor],
              cu_seqlens: torch.Tensor, want: torch.Tensor) -> tuple[PackedHead | None, str]:
    """(the first reading whose logits on the probe equal `want`, the padded forward's
    logits, and why), or (None, why none did). `packed_hidden()` runs `base` packed on the
    same probe."""
    hidden = packed_hidden()
    tolerance = TOLERANCE.get(want.dtype, 1e-4)
    tried = []
    for name, token, read in READINGS:
        head = PackedHead(name, token, read)
        try:
            got = head.logits(model, base, hidden, cu_seqlens)
        except (AttributeError, RuntimeError, TypeError, IndexError):
            continue  # the model has no such modules, or they take another shape
        if got.shape != want.shape:
            continue
        error = relative_error(got, want)
        if error <= tolerance:
            return head, f"packed: {name} on the {token} token (probe error {error:.1e})"
        tried.append(f"{name} ({error:.1e})")
    return None, ("padded: no packed reading of the head matched its own forward"
                  + (f" (tried {', '.join(tried)})" if tried else ""))
