"""Hybrid and attention-free models (Mamba, Mamba-2, Jamba, Qwen3-Next-style linear
attention): the model's own padded forward. Padding is on the right and these models
are causal, so no real token ever sees a pad; last-token pooling by default."""

from states.interface import ModelState


class RecurrentState(ModelState):
    kind = "hybrid_or_attention_free"
    default_pooling = "lasttoken"
