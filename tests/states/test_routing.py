"""Which config gets which state, order included; wrappers route like the bare model.

The table pins `resolve_state`'s answers for configs alone and for built models (whose
attention modules declare `is_causal`), one row per rule and one per ordering between
rules. An unclassifiable model must raise, never fall back to a default.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from states import routing
from states import (
    STATES, DecoderState, EncoderOnlyState, ModelState, UnclassifiedModelError, init_model_state, register_state,
    resolve_state,
)
from states.interface import find_config

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128)
T5 = dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, vocab_size=128)
CONFIGS = {
    "bert": SMALL, "roberta": dict(SMALL, pad_token_id=1), "xlm-roberta": dict(SMALL, pad_token_id=1),
    "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=128),
    "modernbert": dict(SMALL, local_attention=8, pad_token_id=0, bos_token_id=None, eos_token_id=None,
                       cls_token_id=None, sep_token_id=None),
    "electra": dict(SMALL, embedding_size=32), "deberta-v2": SMALL, "mpnet": dict(SMALL, pad_token_id=1),
    "t5": T5, "mt5": T5, "mamba": dict(hidden_size=32, num_hidden_layers=2, vocab_size=128, state_size=8),
    "mamba2": dict(hidden_size=32, num_hidden_layers=2, vocab_size=128, state_size=8, num_heads=2, head_dim=32,
                   n_groups=1),
    "jamba": dict(SMALL, num_key_value_heads=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=2, mamba_d_state=4, mamba_dt_rank=4),
    "qwen3": dict(SMALL, num_key_value_heads=1, head_dim=16), "llama": dict(SMALL, num_key_value_heads=1),
    "mistral": dict(SMALL, num_key_value_heads=1, sliding_window=8), "qwen3_next": {}, "gpt2": {},
}
ENC, DEC, ENCDEC, REC = "encoder_only", "decoder", "encoder_decoder", "hybrid_or_attention_free"


class CustomState(ModelState):
    kind = "custom"


def config(model_type: str, **overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**CONFIGS[model_type], **overrides})


def model(model_type: str, **overrides) -> nn.Module:
    from transformers import AutoModel

    torch.manual_seed(0)
    return AutoModel.from_config(config(model_type, **overrides)).eval()


# (id, builds the model?, model_type, config overrides, expected kind)
TABLE = [
    # one model per supported family, routed by its attention modules' declarations
    *[(f"{t}-model", True, t, {}, ENC) for t in
      ("bert", "roberta", "xlm-roberta", "distilbert", "modernbert", "electra")],
    # DeBERTa-v2 and MPNet declare nothing: transformers registers them as masked-LM only
    ("deberta-v2-model", True, "deberta-v2", {}, ENC),
    ("mpnet-model", True, "mpnet", {}, ENC),
    ("t5-model", True, "t5", {}, ENCDEC),
    ("mt5-model", True, "mt5", {}, ENCDEC),
    ("mamba-model", True, "mamba", {}, REC),
    ("jamba-model: causal attention + SSM layers", True, "jamba", {}, REC),
    *[(f"{t}-model", True, t, {}, DEC) for t in ("qwen3", "llama", "mistral")],
    ("bert-decoder-model", True, "bert", {"is_decoder": True}, DEC),
    # configs alone
    ("qwen3-config: causal-LM family", False, "qwen3", {}, DEC),
    ("gpt2-config", False, "gpt2", {}, DEC),
    ("bert-config-is_decoder", False, "bert", {"is_decoder": True}, DEC),
    ("deberta-v2-config: masked-LM family", False, "deberta-v2", {}, ENC),
    ("t5-config", False, "t5", {}, ENCDEC),
    ("mamba-config", False, "mamba", {}, REC),
    ("mamba2-config", False, "mamba2", {}, REC),
    ("qwen3_next-config: linear-attention layer_types", False, "qwen3_next", {}, REC),
    ("jamba-config", False, "jamba", {}, REC),
    # order between the rules
    ("encoder-decoder beats is_decoder and SSM fields", True, "t5", {"is_decoder": True, "state_size": 16}, ENCDEC),
    ("encoder-decoder flag beats a bert config", False, "bert", {"is_encoder_decoder": True}, ENCDEC),
    ("encoder-decoder flag beats declared bidirectional", True, "bert", {"is_encoder_decoder": True}, ENCDEC),
    ("declared bidirectional beats SSM fields", True, "bert", {"state_size": 16}, ENC),
    ("SSM fields beat declared causal", True, "qwen3", {"state_size": 16}, REC),
    ("non-attention layer_types beat declared causal", True, "qwen3",
     {"layer_types": ["full_attention", "mamba"]}, REC),
    ("declared bidirectional beats is_decoder", True, "modernbert", {"is_decoder": True}, ENC),
]


@pytest.mark.parametrize(
    "build, model_type, overrides, expected", [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_routing_table(build, model_type, overrides, expected):
    if build:
        m = model(model_type, **{k: v for k, v in overrides.items() if k != "layer_types"})
        for key, value in overrides.items():  # set after building, where the model class would reject them
            setattr(m.config, key, value)
        assert resolve_state(m.config, m).kind == expected
        assert init_model_state(m).kind == expected
    else:
        assert resolve_state(config(model_type, **overrides)).kind == expected


def test_states_table_is_complete():
    assert sorted(STATES) == sorted([ENC, DEC, ENCDEC, REC])
    assert {k: cls.kind for k, cls in STATES.items()} == {k: k for k in STATES}


# -- unclassifiable: an error that says what was found and how to override -------------
class MysteryConfig:
    model_type = "pooljobs-mystery"
    architectures = ["MysteryModel"]


class MysteryModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = MysteryConfig()
        self.mixer = nn.Linear(4, 4)


def test_unknown_model_raises():
    m = MysteryModel()
    with pytest.raises(UnclassifiedModelError) as e:
        resolve_state(m.config, m)
    message = str(e.value)
    for part in ("pooljobs-mystery", "MysteryModel", "no attention module declaring is_causal", "state=",
                 "register_state", *STATES):
        assert part in message, part
    assert isinstance(e.value, ValueError)
    with pytest.raises(UnclassifiedModelError):
        init_model_state(m)


def test_bert_config_alone_is_ambiguous():
    """BERT is registered for both masked and causal LM; without the modules it cannot
    be told, and guessing causal would give wrong embeddings."""
    with pytest.raises(UnclassifiedModelError, match="model_type='bert'.*no attention module declaring is_causal"):
        resolve_state(config("bert"))


def test_mixed_declarations_raise():
    """A BERT decoder with cross-attention declares both causal and bidirectional attention."""
    m = model("bert", is_decoder=True, add_cross_attention=True)
    with pytest.raises(UnclassifiedModelError, match=r"is_causal=\[False, True\]"):
        resolve_state(m.config, m)


# -- model-supplied states, registry and override ----------------------------------
@pytest.fixture
def registry():
    saved = dict(routing._REGISTRY)
    yield routing._REGISTRY
    routing._REGISTRY.clear()
    routing._REGISTRY.update(saved)


def test_hook_on_any_module_beats_encoder_decoder():
    m = model("t5")
    m.encoder.block[1].get_model_state_cls = lambda: CustomState
    assert resolve_state(m.config, m) is CustomState
    assert isinstance(init_model_state(m), CustomState)


def test_hook_beats_declared_attention():
    class WithHook(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_model_state_cls(self):
            return CustomState

    wrapped = WithHook(model("qwen3"))
    assert resolve_state(find_config(wrapped), wrapped) is CustomState


@pytest.mark.parametrize("model_type, build", [("qwen3", True), ("t5", True), ("bert", False)])
def test_register_state_beats_builtin_rules(registry, model_type, build):
    register_state(model_type, CustomState)
    if build:
        m = model(model_type)
        assert resolve_state(m.config, m) is CustomState
    else:  # even where the config alone would be unclassifiable
        assert resolve_state(config(model_type)) is CustomState
    assert resolve_state(config("mamba")).kind == REC  # other model types are unaffected


@pytest.mark.parametrize("override, expected", [("decoder", DecoderState), ("encoder_only", EncoderOnlyState)])
def test_override_beats_everything(registry, override, expected):
    register_state("bert", CustomState)
    m = model("bert")
    m.get_model_state_cls = lambda: CustomState
    assert resolve_state(m.config, m, override=override) is expected
    assert resolve_state(MysteryConfig(), MysteryModel(), override=override) is expected
    assert type(init_model_state(m, override=override)) is expected


def test_unknown_override_lists_states():
    with pytest.raises(ValueError, match=r"state='nope' is not a known state; choose one of \['decoder', 'encoder_dec"):
        resolve_state(config("bert"), override="nope")


# -- wrappers route exactly like the bare model ---------------------------------------
class UserWrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.backbone = inner
        self.head = nn.Linear(32, 2)


LORA_TARGETS = {"bert": ["query", "value"], "deberta-v2": ["query_proj", "value_proj"], "t5": ["q", "v"],
                "mamba": ["in_proj"], "qwen3": ["q_proj", "v_proj"]}


def _peft(m: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(m, LoraConfig(r=2, target_modules=LORA_TARGETS[m.config.model_type]))


WRAPPERS = {"peft-lora": _peft, "torch.compile": torch.compile, "user-module": UserWrapper}
WRAPPED = {"bert": ENC, "deberta-v2": ENC, "t5": ENCDEC, "mamba": REC, "qwen3": DEC}


@pytest.mark.parametrize("wrap", list(WRAPPERS))
@pytest.mark.parametrize("model_type", list(WRAPPED))
def test_wrapped_model_routes_like_bare(model_type, wrap):
    bare = model(model_type)
    wrapped = WRAPPERS[wrap](model(model_type))
    assert type(wrapped) is not type(bare)
    assert find_config(wrapped).to_dict() == bare.config.to_dict()
    kind = resolve_state(find_config(wrapped), wrapped).kind
    assert kind == resolve_state(bare.config, bare).kind == WRAPPED[model_type]
    state, bare_state = init_model_state(wrapped), init_model_state(bare)
    assert (state.kind, state.execution) == (bare_state.kind, bare_state.execution)


def test_peft_wrapped_bert_computes_like_bare(tiny_model):
    """LoRA starts as the identity, so the wrapped model's packed forward must equal the
    bare model's padded reference."""
    from transformers import AutoModel

    from hf_reference import assert_close, load_reference, make_pack, random_ids, reference_hidden

    wrapped = _peft(AutoModel.from_pretrained(tiny_model("bert"), dtype=torch.float32).eval())
    state = init_model_state(wrapped, "packed")
    ids = random_ids([1, 9, 30, 64], 1000, 30522, seed=3)
    with torch.no_grad():
        hidden = state.hidden_states(make_pack(ids))  # (T, H)
    want = torch.cat(reference_hidden(load_reference(tiny_model("bert"), ENC), ids, None))
    assert_close(hidden, want)
