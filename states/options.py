"""The options `states/` takes, and the names they may hold (torch-free: the front door
validates against these before anything heavy is imported).

Pooling modes and output dtypes carry sentence-transformers' names and meanings
(`Pooling.POOLING_MODES`, `quantize_embeddings` precisions); pooljobs' earlier pooling
names stay accepted as aliases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Task = Literal["embed", "classify", "score"]
TASKS: tuple[str, ...] = get_args(Task)
DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16")
PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
ST_POOLING_MODES: tuple[str, ...] = get_args(PoolingMode)
POOLING_ALIASES: dict[str, str] = {"last": "lasttoken", "weighted_mean": "weightedmean",
                                   "mean_sqrt_len": "mean_sqrt_len_tokens"}
# Every name `pooling=` accepts: sentence-transformers' modes, then the aliases.
POOLING_MODES: tuple[str, ...] = ST_POOLING_MODES + tuple(POOLING_ALIASES)
# Storage types of embeddings, as `sentence_transformers.quantization.quantize_embeddings`
# defines them (plus float16): int8/uint8 bucket each dimension's calibrated range into 256
# steps; ubinary packs sign bits 8 per byte, binary is that byte minus 128 as int8.
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
CALIBRATED_DTYPES: tuple[str, ...] = ("int8", "uint8")
Execution = Literal["auto", "packed", "padded"]
EXECUTIONS: tuple[str, ...] = get_args(Execution)
COMPILE_CHOICES = ("auto", "on", "off")
# What an embedding job writes per row, several from one forward when asked: a pooled
# vector, a SPLADE sparse vector over the vocabulary, per-token (ColBERT-style) vectors.
OUTPUT_KINDS: tuple[str, ...] = ("dense", "sparse", "multivector")
MULTIVECTOR_DTYPES: tuple[str, ...] = ("float32", "float16")


def parse_outputs(value: str) -> tuple[str, ...]:
    """`dense`, `sparse,multivector`, ... -> the kinds in the given order; ValueError naming
    the valid ones for an unknown or repeated kind."""
    kinds = tuple(k.strip() for k in value.split(","))
    unknown = [k for k in kinds if k not in OUTPUT_KINDS]
    if unknown or not kinds or len(set(kinds)) != len(kinds):
        raise ValueError(f"outputs={value!r}: give one or more of {OUTPUT_KINDS}, comma-separated, each once")
    return kinds


def canonical_pooling(name: str) -> str:
    """sentence-transformers' name of a pooling mode (aliases resolved); ValueError listing
    the valid names otherwise."""
    if name not in POOLING_MODES:
        raise ValueError(f"pooling={name!r} is not a pooling mode; choose one of {POOLING_MODES} or 'auto'")
    return POOLING_ALIASES.get(name, name)


@dataclass(frozen=True)
class ModelOptions:
    """How to load and run the model. `None` / "auto" fields resolve from the model."""

    model: str  # a local directory, or a hub id resolved through the local Hugging Face cache
    task: Task = "embed"
    pooling: str = "auto"
    normalize: bool | None = None
    dim: int | None = None
    max_length: int | None = None
    prompt_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    execution: Execution = "auto"
    state: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    compile: str = "auto"  # auto: on for packed execution on CUDA; on; off
    exact_gelu: bool = False  # compiled bf16/fp16 blocks: keep GELU exact, not in the matmul's epilogue
    route: str | None = None  # a sentence-transformers Router's route (e.g. query, document); default: its own
    revision: str | None = None  # hub ids: the branch, tag or commit in the local cache
    allow_missing_weights: bool = False  # run with weights transformers initialises at random (experiments only)
    calibration: str | None = None  # int8/uint8: .npy of (2, D) ranges or (N, D) embeddings to take them from
    outputs: str = "auto"  # task embed: comma list of OUTPUT_KINDS; auto: what the model was saved as
    sparse_top_k: int | None = None  # sparse: keep each row's k largest weights
    sparse_threshold: float | None = None  # sparse: keep weights above this
