"""Causal decoders used as embedders (Qwen3/LLaMA/Mistral-style): causal attention,
packed execution, last-token pooling by default (the last token is the only one that
has seen the whole text)."""

from states.packed import PackedState


class DecoderState(PackedState):
    kind = "decoder"
    default_pooling = "lasttoken"
