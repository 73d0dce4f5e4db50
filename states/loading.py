"""Loading a model safely: weights and tokenizer (where they are and the model's identity:
`states.files`).

`trust_remote_code` is off unless the caller allows it. Weights transformers would
initialise at random (a missing head or pooler) stop the load unless explicitly allowed,
and so does a tokenizer that cannot read ordinary English: both would give
plausible-looking garbage.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from states.errors import ModelLoadError
from states.files import (  # noqa: F401 - re-exported: the driver and tests take them from here
    CHECK_TEXT, MAX_UNKNOWN, VOCABULARY_FILES, check_model_dir, check_weights, fingerprint, resolve_model,
)
from states.options import Task
from states.pipeline import Pipeline

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _missing(info: dict, task: Task) -> list[str]:
    """Weights transformers initialised at random. An embedding forward never reads
    BERT-style poolers (it takes the last hidden state), so their absence is harmless there."""
    missing = sorted(set(info.get("missing_keys") or ()) | {str(k[0]) if isinstance(k, tuple) else str(k)
                                                            for k in info.get("mismatched_keys") or ()})
    if task == "embed":
        missing = [k for k in missing if "pooler" not in k.split(".")[:2]]
    return missing


def load_model(
    model_dir: Path, task: Task, dtype: torch.dtype, device: torch.device, *,
    trust_remote_code: bool = False, allow_pickle: bool = False, allow_missing_weights: bool = False,
    masked_lm: bool = False,
) -> nn.Module:
    """The transformers model for `task` (AutoModel for embed, with its masked-language-model
    head when `masked_lm`; a sequence-classification head for classify/score), in eval mode
    on `device`. Weights missing from the checkpoint are a ModelLoadError naming them,
    unless `allow_missing_weights`.

    Transformers builds the model on the meta device and writes each checkpoint tensor
    once, cast to `dtype`; only weights the checkpoint lacks are initialised. On an
    accelerator the tensors go straight there (`device_map`), with no copy of the model
    in host memory first."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task != "embed" else AutoModelForMaskedLM if masked_lm else AutoModel
    placement = {} if device.type == "cpu" else {"device_map": device}
    try:
        model, info = auto.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not allow_pickle or None,
            local_files_only=True, output_loading_info=True, **placement,
        )
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{model_dir} needs custom code; pass --trust-remote-code if you trust it") from e
        raise ModelLoadError(f"cannot load {model_dir} for task {task!r}: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load {model_dir}: {e}") from e
    missing = _missing(info, task)
    if missing and not allow_missing_weights:
        head = (" (it has no classification head: is it an embedding model?)" if task != "embed" else
                " (sparse output needs its masked-language-model head: is it a SPLADE / fill-mask model?)" if masked_lm
                else "")
        raise ModelLoadError(
            f"{model_dir}: task {task!r} needs weights the checkpoint does not have{head}; transformers would "
            f"initialise them at random: {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} tensors). "
            "Pass --allow-missing-weights only for experiments"
        )
    return model.to(device).eval()


def _lowercase(tokenizer) -> None:
    """sentence-transformers' `do_lower_case`: a Lowercase normalizer in front of the
    tokenizer's own, unless it lowercases already."""
    from tokenizers import normalizers

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    steps = list(current) if isinstance(current, normalizers.Sequence) else [current] if current is not None else []
    if not any(isinstance(n, normalizers.Lowercase) for n in steps):  # sentence-transformers' own test
        backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), *steps])


def _check_vocabulary(tokenizer, model_dir: Path) -> None:
    ids = tokenizer(CHECK_TEXT, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    unknown = sum(i == unk for i in ids) / max(1, len(ids)) if unk is not None else 0.0
    if not ids or unknown > MAX_UNKNOWN:
        raise ModelLoadError(
            f"the tokenizer of {model_dir} maps {unknown:.0%} of an ordinary English sentence to its unknown token "
            f"(vocabulary of {len(tokenizer)}): its vocabulary files are missing or wrong"
        )


def load_tokenizer(model_dir: Path, trust_remote_code: bool = False, pipeline: Pipeline | None = None):
    """The fast (Rust) tokenizer, with the sentence-transformers Transformer's settings
    (tokenizer kwargs, do_lower_case): batch encoding without padding needs it."""
    from transformers import AutoTokenizer

    # Without a vocabulary file transformers builds an empty tokenizer for the model type
    # (every word becomes <unk>) instead of failing.
    if not any((model_dir / name).exists() for name in VOCABULARY_FILES):
        raise ModelLoadError(f"{model_dir} has no tokenizer vocabulary (looked for {VOCABULARY_FILES})")
    kwargs = dict(pipeline.tokenizer_kwargs) if pipeline else {}
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True,
                                            **kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise ModelLoadError(f"cannot load the tokenizer of {model_dir}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"{model_dir} has no fast tokenizer (tokenizer.json); pooljobs needs one")
    if pipeline is not None and pipeline.do_lower_case:
        _lowercase(tok)
    _check_vocabulary(tok, model_dir)
    return tok
