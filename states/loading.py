"""Loading a model directory safely: where it is, its identity, weights and tokenizer.

Models load from local directories, or from hub ids already in the local Hugging Face
cache (never the network at run time). Safetensors are preferred; pickle weights (`.bin`,
`.pt`) run arbitrary code on load and are refused unless the caller allows them, as is
`trust_remote_code`. Weights transformers would initialise at random (a missing head or
pooler) stop the load unless explicitly allowed, and so does a tokenizer that cannot
read ordinary English: both would give plausible-looking garbage.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn

from states.errors import ModelLoadError
from states.options import Task
from states.pipeline import Pipeline

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model",
)
# Files that hold a vocabulary (tokenizer_config.json alone makes transformers build an
# empty one, in which every word is unknown).
_VOCABULARY_FILES = tuple(n for n in _TOKENIZER_FILES if n != "tokenizer_config.json") + ("merges.txt",)
# What the fingerprint leaves out: documentation, and exports pooljobs never runs.
_NOT_MODEL = (".md", ".txt.lock", ".lock")
_NOT_MODEL_DIRS = {"onnx", "openvino", ".git", ".cache"}
# Ordinary English every text tokenizer must mostly know.
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."
MAX_UNKNOWN = 0.5


def resolve_model(model: str | Path, revision: str | None = None) -> Path:
    """A local directory as given, or a hub id's snapshot in the local Hugging Face cache
    (no network: `snapshot_download(..., local_files_only=True)`)."""
    path = Path(model)
    if path.is_dir():
        if revision is not None:
            raise ModelLoadError(f"revision={revision!r} applies to hub ids; {path} is a local directory")
        return path
    text = str(model)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1 or "/" not in text:
        raise ModelLoadError(f"model path {path} is not a directory (pooljobs loads local model directories, "
                             "or hub ids such as BAAI/bge-small-en-v1.5 from the local Hugging Face cache)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError) as e:
        raise ModelLoadError(
            f"{text}{'@' + revision if revision else ''} is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}; set HF_HUB_CACHE or HF_HOME to use another) and pooljobs does not "
            f"download at run time: fetch it first (huggingface-cli download {text}), or pass a local directory"
        ) from e


def check_weights(path: Path, allow_pickle: bool) -> None:
    """`path` holds a transformers config and weights pooljobs may load."""
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json; is it a transformers model directory?")
    if any((path / name).exists() for name in _SAFE_WEIGHTS):
        return
    pickles = [name for name in _PICKLE_WEIGHTS if (path / name).exists()]
    if pickles and not allow_pickle:
        raise ModelLoadError(
            f"{path} has only pickle weights ({pickles[0]}), which can run code when loaded; "
            "convert them to safetensors, or pass --allow-pickle if you trust the source"
        )
    if not pickles:
        raise ModelLoadError(f"{path} holds no weights (looked for {_SAFE_WEIGHTS + _PICKLE_WEIGHTS})")


def check_model_dir(model: str | Path, allow_pickle: bool, revision: str | None = None) -> Path:
    """The model's directory (a hub id resolved in the local cache), once it is known to
    hold a config and loadable weights (a sentence-transformers export: at least its
    modules.json; its Transformer's folder is checked when the pipeline is read)."""
    path = resolve_model(model, revision)
    if not (path / "modules.json").exists():
        check_weights(path, allow_pickle)
    return path


def _model_files(model_dir: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_MODEL_DIRS)
        files += [Path(root, n) for n in sorted(names) if not n.endswith(_NOT_MODEL) and not n.startswith(".")]
    return files


def fingerprint(model_dir: Path) -> str:
    """sha256 over every file that can change the outputs (names and contents): config and
    weights, every tokenizer file, every sentence-transformers module's config and weights,
    prompts; documentation and ONNX/OpenVINO exports are left out."""
    digest = hashlib.sha256()
    for file in _model_files(model_dir):
        digest.update(file.relative_to(model_dir).as_posix().encode() + b"\0")
        with file.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def _missing(info: dict, task: Task) -> list[str]:
    """Weights transformers initialised at random. An embedding forward never reads
    BERT-style poolers (it takes the last hidden state), so their absence is harmless there."""
    missing = sorted(set(info.get("missing_keys") or ()) | {str(k[0]) if isinstance(k, tuple) else str(k)
                                                            for k in info.get("mismatched_keys") or ()})
    if task == "embed":
        missing = [k for k in missing if not k.split(".")[0] == "pooler" and ".pooler." not in f".{k}"]
    return missing


def load_model(
    model_dir: Path, task: Task, dtype: torch.dtype, device: torch.device, *,
    trust_remote_code: bool = False, allow_pickle: bool = False, allow_missing_weights: bool = False,
) -> nn.Module:
    """The transformers model for `task` (AutoModel for embed, a sequence-classification
    head for classify/score), in eval mode on `device`. Weights missing from the
    checkpoint are a ModelLoadError naming them, unless `allow_missing_weights`."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModel if task == "embed" else AutoModelForSequenceClassification
    try:
        model, info = auto.from_pretrained(
            model_dir, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not allow_pickle or None,
            local_files_only=True, output_loading_info=True,
        )
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{model_dir} needs custom code; pass --trust-remote-code if you trust it") from e
        raise ModelLoadError(f"cannot load {model_dir} for task {task!r}: {e}") from e
    except OSError as e:
        raise ModelLoadError(f"cannot load {model_dir}: {e}") from e
    missing = _missing(info, task)
    if missing and not allow_missing_weights:
        head = " (it has no classification head: is it an embedding model?)" if task != "embed" else ""
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
    if not any((model_dir / name).exists() for name in _VOCABULARY_FILES):
        raise ModelLoadError(f"{model_dir} has no tokenizer vocabulary (looked for {_VOCABULARY_FILES})")
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
