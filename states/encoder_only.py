"""Bidirectional encoders (BERT, RoBERTa, XLM-R, DistilBERT, ModernBERT, ...): non-causal
attention, no KV cache, packed execution. CLS pooling unless the model says otherwise."""

from states.packed import PackedState


class EncoderOnlyState(PackedState):
    kind = "encoder_only"
    default_pooling = "cls"
