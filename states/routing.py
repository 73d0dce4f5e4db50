"""Which ModelState runs a model, decided from its config and declared attention.

Mirrors vLLM's `init_model_state`, with the lesson of its PR #52425: never route on the
Python class of a module (wrappers such as PEFT, torch.compile or the Transformers
backend hide it). The questions, most specific first:

1. does the model supply its own state (`get_model_state_cls()`, or `register_state`)?
2. is the config encoder-decoder?                        -> EncoderDecoderState
3. do the attention layers declare `is_causal=False`?     -> EncoderOnlyState
4. does the config declare SSM / linear-attention layers? -> RecurrentState
5. do they declare `is_causal=True`?                      -> DecoderState

Where the modules declare nothing, the config's `is_decoder` flag and the task families
transformers registers the `model_type` under (masked-LM only: bidirectional; causal-LM
only: causal) decide. Anything else is an `UnclassifiedModelError`, never a default:
a wrong attention mask yields plausible-looking, wrong embeddings.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from states.decoder import DecoderState
from states.errors import UnclassifiedModelError
from states.encoder_decoder import EncoderDecoderState
from states.encoder_only import EncoderOnlyState
from states.interface import Execution, ModelState, Pack, find_config
from states.recurrent import RecurrentState

STATES: dict[str, type[ModelState]] = {
    cls.kind: cls for cls in (EncoderOnlyState, DecoderState, EncoderDecoderState, RecurrentState)
}
_REGISTRY: dict[str, type[ModelState]] = {}

# Layer kinds a config may declare in `layer_types` (or older spellings) that are attention.
_ATTENTION_LAYER_KINDS = {"full_attention", "sliding_attention", "chunked_attention", "attention", "global", "local"}
# Config fields only state-space / recurrent mixers have.
_SSM_FIELDS = ("state_size", "ssm_state_size", "mamba_d_state", "d_state", "linear_num_key_heads")


def register_state(model_type: str, cls: type[ModelState]) -> None:
    """Route every model of `model_type` to `cls` (checked before any built-in rule)."""
    _REGISTRY[model_type] = cls


def _supplied_state(model: nn.Module | None, config) -> type[ModelState] | None:
    if model is not None:
        for module in model.modules():
            hook: Callable[[], type[ModelState]] | None = getattr(module, "get_model_state_cls", None)
            if callable(hook):
                return hook()
    return _REGISTRY.get(config.model_type)


def _declares_recurrent_layers(config) -> bool:
    for field in ("layer_types", "layers_block_type", "block_types"):
        kinds = getattr(config, field, None)
        if kinds and any(str(k) not in _ATTENTION_LAYER_KINDS for k in kinds):
            return True
    return any(getattr(config, f, None) is not None for f in _SSM_FIELDS)


def _declared_causality(model: nn.Module | None) -> set[bool]:
    """The `is_causal` values the model's attention modules declare (empty when none do)."""
    if model is None:
        return set()
    return {m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)}


def _config_causality(config) -> bool | None:
    if getattr(config, "is_decoder", False):
        return True
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    masked = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if masked != causal:
        return causal
    return None


def resolve_state(config, model: nn.Module | None = None, override: str | None = None) -> type[ModelState]:
    """The ModelState class for a config (and, when loaded, the model's declarations)."""
    if override is not None:
        if override not in STATES:
            raise ValueError(f"state={override!r} is not a known state; choose one of {sorted(STATES)}")
        return STATES[override]
    supplied = _supplied_state(model, config)
    if supplied is not None:
        return supplied
    if getattr(config, "is_encoder_decoder", False):
        return EncoderDecoderState
    declared = _declared_causality(model)
    if declared == {False}:
        return EncoderOnlyState
    if _declares_recurrent_layers(config):
        return RecurrentState
    if declared == {True}:
        return DecoderState
    if not declared:
        causal = _config_causality(config)
        if causal is not None:
            return DecoderState if causal else EncoderOnlyState
    found = f"attention modules declaring is_causal={sorted(declared)}" if declared else "no attention module declaring is_causal"
    raise UnclassifiedModelError(
        f"cannot tell how to run model_type={config.model_type!r} "
        f"(architectures={getattr(config, 'architectures', None)}): found {found}, "
        f"is_encoder_decoder={getattr(config, 'is_encoder_decoder', False)}, is_decoder={getattr(config, 'is_decoder', False)}, "
        f"no SSM/linear-attention layers declared. Pass --state / state= one of {sorted(STATES)}, "
        "or register one with states.register_state(model_type, cls)."
    )


def init_model_state(
    model: nn.Module, execution: Execution = "auto", override: str | None = None
) -> ModelState:
    """Route `model` (bare or wrapped) to its state and build it."""
    cls = resolve_state(find_config(model), model, override)
    return cls(model, execution)


__all__ = [
    "STATES", "DecoderState", "EncoderDecoderState", "EncoderOnlyState", "Execution", "ModelState", "Pack",
    "RecurrentState", "UnclassifiedModelError", "init_model_state", "register_state", "resolve_state",
]
