"""The ModelState contract: how one kind of model turns a pack of tokens into outputs.

Workers hand a state a `Pack` (sequences back to back, no padding) and get back packed
hidden states `(T, H)` for pooling, or per-sequence logits `(B, C)` for classification.
Whether the state runs the pack as-is (variable-length attention) or pads it for the
model's own forward is the state's business; workers never look inside the model.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from states.options import EXECUTIONS, Execution



@dataclass
class Pack:
    """Sequences concatenated without padding; `cu_seqlens` marks the boundaries."""

    input_ids: torch.Tensor  # (T,) int64
    position_ids: torch.Tensor  # (T,) int64, restarting at 0 in each sequence
    token_type_ids: torch.Tensor | None  # (T,) int64, or None when the tokenizer gives none
    cu_seqlens: torch.Tensor  # (B+1,) int32, cu_seqlens[0] == 0, cu_seqlens[-1] == T
    max_len: int  # longest sequence in the pack

    @classmethod
    def from_sequences(cls, sequences: list[list[int]]) -> Pack:
        """A CPU pack of these token id lists (small packs: warm-up, tests)."""
        lengths = torch.tensor([len(s) for s in sequences])
        cu = torch.zeros(len(sequences) + 1, dtype=torch.int32)
        cu[1:] = lengths.cumsum(0)
        positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
        ids = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
        return cls(ids, positions, None, cu, int(lengths.max()))

    @classmethod
    def from_flat(cls, flat: torch.Tensor, tokens: int, seqs: int, typed: bool, max_len: int) -> Pack:
        """A pack whose fields are views into one int64 buffer of at least `flat_size` words:
        ids, positions, [types,] then `cu_seqlens` as int32 pairs in the last words. One
        buffer moves to the device in one copy, and the views are rebuilt there alike."""
        field = lambda i: flat[i * tokens : (i + 1) * tokens]  # noqa: E731
        words = 3 if typed else 2
        cu = flat[words * tokens : words * tokens + (seqs + 2) // 2].view(torch.int32)[: seqs + 1]
        ids, positions, types = field(0), field(1), field(2) if typed else None
        return cls(ids, positions, types, cu, max_len)

    @staticmethod
    def flat_size(tokens: int, seqs: int, typed: bool) -> int:
        """int64 words of a `from_flat` buffer."""
        return (3 if typed else 2) * tokens + (seqs + 2) // 2

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.numel() - 1

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Pack:
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Pack(
            move(self.input_ids), move(self.position_ids), move(self.token_type_ids),
            move(self.cu_seqlens), self.max_len,
        )

    def pin_memory(self) -> Pack:
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return Pack(pin(self.input_ids), pin(self.position_ids), pin(self.token_type_ids), pin(self.cu_seqlens), self.max_len)


def to_padded(pack: Pack, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`/`attention_mask` (and `token_type_ids`), each (B, L)."""
    lengths = pack.cu_seqlens[1:] - pack.cu_seqlens[:-1]  # (B,)
    mask = torch.arange(pack.max_len, device=lengths.device)[None, :] < lengths[:, None]  # (B, L)
    ids = torch.full(mask.shape, pad_id, dtype=pack.input_ids.dtype, device=mask.device)
    ids[mask] = pack.input_ids
    out = {"input_ids": ids, "attention_mask": mask.long()}
    if pack.token_type_ids is not None:
        types = torch.zeros_like(ids)
        types[mask] = pack.token_type_ids
        out["token_type_ids"] = types
    return out


def from_padded(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, H) right-padded hidden states -> (T, H) packed, in sequence order."""
    return hidden[attention_mask.bool()]


def unpad_output(out, attention_mask: torch.Tensor, all_layers: bool) -> torch.Tensor:
    """A padded forward's output -> (T, H) last hidden states, or (L+1, T, H) every layer's."""
    if not all_layers:
        return from_padded(out[0], attention_mask)
    return torch.stack([from_padded(h, attention_mask) for h in out.hidden_states])


def find_config(model: nn.Module):
    """The transformers config of a model, through any wrapper (PEFT, torch.compile, user modules)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "model_type"):
            return config
    raise ValueError(f"{type(model).__name__} carries no transformers config in any submodule")


def find_pretrained(model: nn.Module) -> nn.Module:
    """The innermost module that owns the attention implementation switch."""
    for module in model.modules():
        if hasattr(module, "set_attn_implementation") and hasattr(module, "config"):
            return module
    raise ValueError(f"{type(model).__name__} wraps no transformers PreTrainedModel")


class ModelState(ABC):
    """One way of running a kind of model. Subclasses override what they support.

    `kind` names the routing outcome (pinned by tests); `default_pooling` is what
    `pooling="auto"` means when the model ships no sentence-transformers config.
    """

    kind: ClassVar[str]
    default_pooling: ClassVar[str] = "mean"
    supports_packed: ClassVar[bool] = False
    head_reading: str | None = None  # how a packed state reads the classification head (`states.heads`)

    def __init__(self, model: nn.Module, execution: Execution = "auto") -> None:
        if execution not in EXECUTIONS:
            raise ValueError(f"execution={execution!r}; choose one of {EXECUTIONS}")
        if execution == "packed" and not self.supports_packed:
            raise ValueError(
                f"execution='packed' is not available for {self.kind} models ({type(self).__name__}); "
                "use execution='padded' or 'auto'"
            )
        self.model = model
        self.config = find_config(model)
        self.packed = self.supports_packed and execution != "padded"
        self.pad_id = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        # Nothing is decoded after a pooling forward: a KV / SSM cache (which decoders
        # build by default) would only hold memory the size of the pack's activations.
        if getattr(self.config, "use_cache", False):
            self.config.use_cache = False

    @property
    def execution(self) -> str:
        return "packed" if self.packed else "padded"

    def hidden_states(self, pack: Pack, all_layers: bool = False) -> torch.Tensor:
        """Last hidden states of every token, (T, H), in pack order; with `all_layers`, the
        embeddings' and every layer's, (L+1, T, H)."""
        padded = to_padded(pack, self.pad_id)
        out = self.model(**padded, output_hidden_states=all_layers)
        return unpad_output(out, padded["attention_mask"], all_layers)

    def logits(self, pack: Pack) -> torch.Tensor:
        """Sequence-classification logits, (B, C), from the model's own forward on the padded
        batch (states that run packed override this where a head's reading is verified:
        `states.heads`)."""
        padded = to_padded(pack, self.pad_id)
        return self.model(**padded).logits
