"""A cheap check of a model and its options before any worker starts (torch-free).

`check(options)` reads only small files: config.json, the sentence-transformers module
configs, the tokenizer files and the safetensors headers (tensor names), never the
weights, and raises `ModelLoadError` for what would fail or run wrong at load: an unknown
sentence-transformers module, `dim` beyond the final embedding size (after Dense layers),
`max_length` beyond the model's limit, classify/score on a checkpoint without head weights,
tokenizer files without a usable vocabulary. The workers' load checks the same things
exactly (`states.runtime.Runtime`); this is the early, approximate half for the front door.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from states.errors import ModelLoadError
from states.files import CHECK_TEXT, MAX_UNKNOWN, VOCABULARY_FILES, check_model_dir, check_weights
from states.options import ModelOptions
from states.pipeline import Pipeline, model_limit, output_size, read_json, read_pipeline

# Top-level names sequence-classification heads have in transformers checkpoints.
_HEAD_NAMES = ("classifier", "score", "classification_head", "pre_classifier", "logits_proj", "sequence_summary")
# Embeddings that start positions after padding_idx (= pad_token_id), RoBERTa-style.
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "data2vec-text", "ibert"}
_HIDDEN_SIZE_KEYS = ("hidden_size", "d_model", "dim", "n_embd")


@dataclass(frozen=True)
class ModelFacts:
    """What the files say, for messages and planning."""

    model_dir: Path
    pipeline: Pipeline
    max_length: int  # the model's limit
    embedding_size: int | None  # task embed: the size after pooling and Dense layers (before `dim`)


def _tensor_names(path: Path) -> set[str] | None:
    """Tensor names from the safetensors header(s); None when only pickles hold them."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return set(read_json(index).get("weight_map", {}))
    if not (path / "model.safetensors").exists():
        return None
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", framework="numpy") as f:
        return set(f.keys())


def _check_head(path: Path, config: dict, task: str) -> None:
    names = _tensor_names(path)
    if names is None:
        return
    prefixes = {n.split(".")[0] for n in names}
    if not any(h in prefixes for h in _HEAD_NAMES):
        raise ModelLoadError(
            f"{path}: task {task!r} needs a sequence-classification head, and the checkpoint holds no head weights "
            f"(architectures={config.get('architectures')}); is it an embedding model? "
            "Pass --allow-missing-weights only for experiments")


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _check_tokenizer(path: Path, tokenizer_config: dict) -> None:
    if not any((path / name).exists() for name in VOCABULARY_FILES):
        raise ModelLoadError(f"{path} has no tokenizer vocabulary (looked for {VOCABULARY_FILES})")
    if not (path / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - the Rust library raises its own exception type
        raise ModelLoadError(f"cannot read {path / 'tokenizer.json'}: {e}") from e
    unk = _token_text(tokenizer_config.get("unk_token"))
    tokens = tokenizer.encode(CHECK_TEXT, add_special_tokens=False).tokens
    unknown = sum(t == unk for t in tokens) / max(1, len(tokens)) if unk else 0.0
    if not tokens or unknown > MAX_UNKNOWN:
        raise ModelLoadError(f"the tokenizer of {path} maps {unknown:.0%} of an ordinary English sentence to its "
                             "unknown token: its vocabulary files are missing or wrong")


def _embedding_size(pipeline: Pipeline, config: dict, pooling: str) -> int | None:
    size = next((config[k] for k in _HIDDEN_SIZE_KEYS if isinstance(config.get(k), int)), None)
    if size is None:
        return None
    size *= len(pipeline.pooling or ("one",)) if pooling == "auto" else 1
    for spec in pipeline.post:
        size = output_size(spec, size)
    return size


def check(options: ModelOptions) -> ModelFacts:
    """ModelLoadError for a model/options pair that cannot run as asked (see the module
    docstring); the facts read on the way otherwise."""
    model_dir = check_model_dir(options.model, options.allow_pickle, options.revision)
    pipeline = read_pipeline(model_dir, options.route)
    source = pipeline.transformer_dir
    check_weights(source, options.allow_pickle)
    config = read_json(source / "config.json")
    tokenizer_config = read_json(source / "tokenizer_config.json") if (source / "tokenizer_config.json").exists() else {}
    _check_tokenizer(source, tokenizer_config)
    if options.task != "embed" and not options.allow_missing_weights:
        _check_head(source, config, options.task)
    positions = config.get("max_position_embeddings")
    if positions and config.get("model_type") in _OFFSET_POSITIONS:
        positions -= (config.get("pad_token_id") or 0) + 1
    tokenizer_max = pipeline.tokenizer_kwargs.get("model_max_length", tokenizer_config.get("model_max_length"))
    limit = model_limit(pipeline, tokenizer_max, positions)
    if options.max_length is not None and options.max_length > limit:
        raise ModelLoadError(f"max_length={options.max_length} exceeds what the model takes ({limit})")
    size = _embedding_size(pipeline, config, options.pooling) if options.task == "embed" else None
    if options.dim is not None and size is not None and options.dim > size:
        raise ModelLoadError(f"dim={options.dim} exceeds the model's embedding size {size}")
    return ModelFacts(model_dir, pipeline, limit, size)
