"""Shared base for states that can run a pack as one variable-length row.

Both encoders and causal decoders route their attention through transformers'
attention interface; the registered `pooljobs_varlen` function reads the module's own
`is_causal` declaration, so one forward serves both and the subclasses only name
their kind and default pooling.
"""

from __future__ import annotations

import torch
from torch import nn

from states import attention
from states.interface import Execution, ModelState, Pack, find_pretrained


def position_offset(model: nn.Module) -> int:
    """First position id of a sequence. RoBERTa-style embeddings reserve the positions up
    to `padding_idx` and start at `padding_idx + 1`; they declare it as the position
    embedding's `padding_idx`."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, nn.Embedding):
            return 0 if module.padding_idx is None else module.padding_idx + 1
    return 0


class PackedState(ModelState):
    """Packed where the model's attention goes through transformers' attention interface
    (`_supports_attention_backend`); otherwise (e.g. DeBERTa-v2, MPNet with relative
    positions) the model's own padded forward, with the same results."""

    def __init__(self, model: nn.Module, execution: Execution = "auto") -> None:
        pretrained = find_pretrained(model)
        self.supports_packed = bool(getattr(pretrained, "_supports_attention_backend", False))
        super().__init__(model, execution)
        self.position_offset = position_offset(model)
        if self.packed:
            pretrained.set_attn_implementation(attention.ATTN_NAME)

    def hidden_states(self, pack: Pack, all_layers: bool = False) -> torch.Tensor:
        if not self.packed:
            return super().hidden_states(pack, all_layers)
        extra = {} if pack.token_type_ids is None else {"token_type_ids": pack.token_type_ids[None]}
        out = self.model(
            input_ids=pack.input_ids[None],  # (1, T)
            position_ids=(pack.position_ids + self.position_offset)[None],  # (1, T)
            cu_seq_lens_q=pack.cu_seqlens,
            cu_seq_lens_k=pack.cu_seqlens,
            max_length_q=pack.max_len,
            max_length_k=pack.max_len,
            output_hidden_states=all_layers,
            **extra,
        )
        if all_layers:
            return torch.stack([h[0] for h in out.hidden_states])  # (L+1, T, H)
        return out[0][0]  # (T, H)
