"""Loading a model directory safely: weights, tokenizer, sentence-transformers settings.

Only local directories are loaded (no hub access at run time). Safetensors are
preferred; pickle weights (`.bin`, `.pt`) run arbitrary code on load and are refused
unless the caller allows them, as is `trust_remote_code`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from states.errors import ModelLoadError
from states.options import Task

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model",
)


@dataclass(frozen=True)
class SentenceSettings:
    """What a sentence-transformers export says about pooling, normalization and prompts."""

    pooling: str | None = None
    normalize: bool = False
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weighted_mean",
    "pooling_mode_lasttoken": "last",
}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def read_sentence_settings(model_dir: Path) -> SentenceSettings:
    """Parse modules.json, the Pooling module's config, sentence_bert_config.json and
    config_sentence_transformers.json; an empty result when the directory has none."""
    modules_file = model_dir / "modules.json"
    pooling, normalize = None, False
    if modules_file.exists():
        for module in _read_json(modules_file):
            kind = module.get("type", "")
            if kind.endswith(".Pooling"):
                cfg = _read_json(model_dir / module["path"] / "config.json")
                modes = [name for key, name in _ST_POOLING_KEYS.items() if cfg.get(key)]
                if len(modes) != 1:
                    raise ModelLoadError(
                        f"{model_dir}: the Pooling module enables {modes or 'no mode'}; pooljobs supports exactly one. "
                        "Pass pooling= explicitly."
                    )
                pooling = modes[0]
            elif kind.endswith(".Normalize"):
                normalize = True
    bert_cfg = model_dir / "sentence_bert_config.json"
    max_len = _read_json(bert_cfg).get("max_seq_length") if bert_cfg.exists() else None
    st_cfg = model_dir / "config_sentence_transformers.json"
    st = _read_json(st_cfg) if st_cfg.exists() else {}
    return SentenceSettings(pooling, normalize, max_len, dict(st.get("prompts") or {}), st.get("default_prompt_name"))


def check_model_dir(model_dir: str | Path, allow_pickle: bool) -> Path:
    """The directory, once it is known to hold a config and loadable weights."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory (pooljobs loads local model directories only)")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json; is it a transformers model directory?")
    if any((path / name).exists() for name in _SAFE_WEIGHTS):
        return path
    pickles = [name for name in _PICKLE_WEIGHTS if (path / name).exists()]
    if pickles and not allow_pickle:
        raise ModelLoadError(
            f"{path} has only pickle weights ({pickles[0]}), which can run code when loaded; "
            "convert them to safetensors, or pass --allow-pickle if you trust the source"
        )
    if not pickles:
        raise ModelLoadError(f"{path} holds no weights (looked for {_SAFE_WEIGHTS + _PICKLE_WEIGHTS})")
    return path


def fingerprint(model_dir: Path) -> str:
    """sha256 over the config and weight files, so outputs name the exact model."""
    digest = hashlib.sha256()
    for file in sorted(model_dir.iterdir()):
        if file.name == "config.json" or file.suffix in (".safetensors", ".bin"):
            digest.update(file.name.encode())
            with file.open("rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
    return digest.hexdigest()


def load_model(
    model_dir: Path, task: Task, dtype: torch.dtype, device: torch.device, *,
    trust_remote_code: bool = False, allow_pickle: bool = False,
) -> nn.Module:
    """The transformers model for `task` (AutoModel for embed, a sequence-classification
    head for classify/score), in eval mode on `device`."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModel if task == "embed" else AutoModelForSequenceClassification
    try:
        model = auto.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not allow_pickle or None,
            local_files_only=True,
        )
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{model_dir} needs custom code; pass --trust-remote-code if you trust it") from e
        raise ModelLoadError(f"cannot load {model_dir} for task {task!r}: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load {model_dir}: {e}") from e
    return model.to(device).eval()


def load_tokenizer(model_dir: Path, trust_remote_code: bool = False):
    """The fast (Rust) tokenizer: batch encoding without padding needs it."""
    from transformers import AutoTokenizer

    # Without any tokenizer file transformers builds an empty tokenizer for the model
    # type (every word becomes <unk>) instead of failing.
    if not any((model_dir / name).exists() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{model_dir} has no tokenizer (looked for {_TOKENIZER_FILES})")
    try:
        tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load the tokenizer of {model_dir}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"{model_dir} has no fast tokenizer (tokenizer.json); pooljobs needs one")
    return tok
