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
from states.heads import PackedHead, base_of, find_head, probe_ids
from states.interface import Execution, ModelState, Pack, find_pretrained, to_padded


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
    positions) the model's own padded forward, with the same results.

    A sequence-classification model runs packed too when one of `states.heads`' readings of
    its head matches its own padded forward on a probe (checked here, before its attention
    is switched to the packed function); `head_reading` says which, or why it runs padded."""

    def __init__(self, model: nn.Module, execution: Execution = "auto") -> None:
        pretrained = find_pretrained(model)
        self.supports_packed = bool(getattr(pretrained, "_supports_attention_backend", False))
        super().__init__(model, execution)
        self.position_offset = position_offset(model)
        self._pretrained, self._base = pretrained, base_of(pretrained)
        self.head: PackedHead | None = None
        if self.packed and self._base is not None:
            self._find_head(execution)
        if self.packed:
            pretrained.set_attn_implementation(attention.ATTN_NAME)

    def _find_head(self, execution: Execution) -> None:
        """Before the attention is switched: the model's own padded forward on a probe;
        when it gives logits, the reading of its head that matches them (`states.heads`),
        else the model runs padded. A forward without logits is a base model in a wrapper
        (PEFT's `model` looks like a base model prefix), which needs no head."""
        pretrained = self._pretrained
        own = pretrained.config._attn_implementation
        probe = Pack.from_sequences(probe_ids(self.config.vocab_size, {self.pad_id}))
        probe = probe.to(next(pretrained.parameters()).device)
        with torch.inference_mode():
            want = getattr(self.model(**to_padded(probe, self.pad_id)), "logits", None)
            if want is None:
                self._base = None
                return
            pretrained.set_attn_implementation(attention.ATTN_NAME)
            self.head, self.head_reading = find_head(pretrained, self._base, lambda: self._packed(self._base, probe),
                                                     probe.cu_seqlens, want)
        if self.head is None:
            pretrained.set_attn_implementation(own)
            self.packed = False
            if execution == "packed":
                raise ValueError(f"execution='packed': {type(pretrained).__name__}'s head {self.head_reading}; "
                                 "use execution='auto' or 'padded'")

    def hidden_states(self, pack: Pack, all_layers: bool = False) -> torch.Tensor:
        if not self.packed:
            return super().hidden_states(pack, all_layers)
        return self._packed(self.model, pack, all_layers)

    def logits(self, pack: Pack) -> torch.Tensor:
        if self.head is None:
            return super().logits(pack)
        hidden = self._packed(self._base, pack)  # (T, H)
        return self.head.logits(self._pretrained, self._base, hidden, pack.cu_seqlens)

    def _packed(self, module: nn.Module, pack: Pack, all_layers: bool = False) -> torch.Tensor:
        """`module`'s last hidden states (T, H) of the pack run as one row (all layers':
        (L+1, T, H))."""
        extra = {} if pack.token_type_ids is None else {"token_type_ids": pack.token_type_ids[None]}
        out = module(
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
