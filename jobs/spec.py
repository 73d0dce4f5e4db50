"""The job spec: one definition behind CLI flags, YAML job files and the notebook API.

Each field's metadata carries its help text; `jobs.cli` turns the fields into flags and
`JobSpec.from_mapping` validates a YAML mapping with errors that name the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from states.options import (
    CALIBRATED_DTYPES, COMPILE_CHOICES, DTYPE_NAMES, EXECUTIONS, OUTPUT_DTYPES, POOLING_MODES, TASKS, ModelOptions,
)

INPUT_FORMATS = ("auto", "parquet", "ipc", "jsonl", "csv")
OVERLONG = ("truncate", "chunk")
CHUNK_AGGREGATE = ("mean", "none")
ON_ERROR = ("quarantine", "fail")
BACKENDS = ("auto", "ray", "local")


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


class SpecError(ValueError):
    """A job option is invalid; the message names the option."""


@dataclass(frozen=True)
class JobSpec:
    input: str | list[str] = _f("", "input file, directory, glob or URI (s3://, gs://); a list in YAML")
    output: str = _f("", "output directory or URI for shards, manifest and report")
    model: str = _f("", "local model directory (transformers / sentence-transformers layout)")
    task: str = _f("embed", "what to compute", TASKS)
    input_format: str = _f("auto", "input format; auto detects it from the file extension", INPUT_FORMATS)
    text_column: str = _f("text", "column holding the text")
    pair_column: str | None = _f(None, "second text column for pair scoring (cross-encoders)")
    id_column: str | None = _f(None, "column copied to the output as the row id; default: a stable row key")
    pooling: str = _f("auto", "pooling mode; auto reads the sentence-transformers config", ("auto", *POOLING_MODES))
    normalize: bool | None = _f(None, "L2-normalize embeddings (default: as the model's config says)")
    dim: int | None = _f(None, "Matryoshka truncation to this many dimensions (renormalized when normalizing)")
    output_dtype: str = _f("float32", "embedding storage type, as sentence-transformers' quantize_embeddings: "
                           "int8/uint8 (calibrated ranges), ubinary (sign bits 8 per byte), binary (ubinary - 128)",
                           OUTPUT_DTYPES)
    max_length: int | None = _f(None, "truncate texts to this many tokens (default: the model's limit)")
    overlong: str = _f("truncate", "texts over max_length: truncate them (counted), or split them into windows", OVERLONG)
    chunk_stride: int = _f(32, "with overlong=chunk: tokens each window shares with the previous one")
    chunk_aggregate: str = _f("mean", "with overlong=chunk: mean the windows' embeddings per row (renormalized), "
                              "or none: one output row per window with a `chunk` index", CHUNK_AGGREGATE)
    prompt_name: str | None = _f(None, "sentence-transformers prompt to prepend (default: the model's default)")
    device: str = _f("auto", "auto, cpu, cuda or cuda:N")
    dtype: str = _f("auto", "compute dtype; auto is bfloat16 on CUDA, float32 on CPU", ("auto", *DTYPE_NAMES))
    execution: str = _f("auto", "packed (varlen attention) or padded (plain transformers reference)", EXECUTIONS)
    state: str | None = _f(None, "force a ModelState kind instead of routing from the config")
    compile: str = _f("auto", "torch.compile the model's layer blocks: auto is on for packed CUDA runs", COMPILE_CHOICES)
    exact_gelu: bool = _f(False, "compiled bf16/fp16 blocks: keep GELU exact instead of fusing bias + GELU (tanh "
                          "form, at most 4.7e-4 apart) into the matmul")
    trust_remote_code: bool = _f(False, "allow the model directory's own Python code to run")
    allow_pickle: bool = _f(False, "allow pickle (.bin) weights, which can run code when loaded")
    on_error: str = _f("quarantine", "bad rows: quarantine them under OUT/_errors or fail the unit", ON_ERROR)
    unit_rows: int = _f(50_000, "rows per work unit (one output shard each)")
    window_rows: int = _f(256, "rows tokenized together (one CPU task on GPU workers) and sorted by length before packing")
    max_tokens: int | None = _f(None, "token budget per forward (default: sized from free device memory)")
    num_workers: int | None = _f(None, "actors to start (default: one per GPU, or one CPU worker without GPUs)")
    max_retries: int = _f(3, "times a failing unit is retried before it is recorded as failed")
    overwrite: bool = _f(False, "replace an output directory written with other settings or by something else")
    backend: str = _f("auto", "ray (actors), local (in this process), or auto", BACKENDS)
    address: str | None = _f(None, "Ray address (default: the job's cluster, else a local Ray without dashboard)")
    storage_options: dict = _f({}, "pyarrow.fs options for URIs, e.g. {endpoint_override: ..., region: ...}")
    progress: bool | None = _f(None, "progress bar (default: on a terminal; log lines otherwise)")
    route: str | None = _f(None, "sentence-transformers Router route to run (e.g. query, document; default: the model's)")
    revision: str | None = _f(None, "hub ids: the branch, tag or commit to take from the local Hugging Face cache")
    allow_missing_weights: bool = _f(False, "run even though the checkpoint lacks weights (a head, a pooler) that "
                                     "would be initialised at random; for experiments only")
    calibration: str | None = _f(None, "int8/uint8 output: a .npy of (2, dim) ranges, or of sample embeddings "
                                 "whose per-dimension min/max become the ranges")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise SpecError(f"{f.name}={value!r} is not valid; choose one of {list(choices)}")
        for name in ("input", "output", "model"):
            if not getattr(self, name):
                raise SpecError(f"{name} is required")
        for name in ("unit_rows", "window_rows", "max_tokens", "dim", "max_length", "num_workers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise SpecError(f"{name}={value!r} must be a positive integer")
        if self.overlong == "chunk" and self.task != "embed":
            raise SpecError(f"overlong='chunk' works with task 'embed' only (got task {self.task!r})")
        if self.chunk_stride < 0:
            raise SpecError(f"chunk_stride={self.chunk_stride} must be >= 0")
        if self.max_retries < 0:
            raise SpecError(f"max_retries={self.max_retries} must be >= 0")
        if self.task == "score" and not self.pair_column:
            raise SpecError("task 'score' needs pair_column (the second text of each pair)")
        if self.output_dtype in ("binary", "ubinary") and self.dim is not None and self.dim % 8:
            raise SpecError(f"output_dtype {self.output_dtype!r} packs 8 dimensions per byte; "
                            f"dim={self.dim} is not a multiple of 8")
        if self.output_dtype in CALIBRATED_DTYPES and self.calibration is None and self.task == "embed":
            raise SpecError(f"output_dtype {self.output_dtype!r} buckets each dimension's calibrated range into "
                            "256 steps: pass calibration=FILE.npy (the (2, dim) ranges, or sample embeddings)")

    @classmethod
    def from_mapping(cls, values: dict[str, Any], source: str = "job file") -> JobSpec:
        known = {f.name: f for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                raise SpecError(f"{source}: unknown key {key!r}; valid keys: {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    @property
    def model_options(self) -> ModelOptions:
        names = {f.name for f in dataclasses.fields(ModelOptions)}
        return ModelOptions(**{n: getattr(self, n) for n in names})

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The options that change output values or layout; a resume must match them."""
        skip = {"input", "output", "num_workers", "max_retries", "overwrite", "backend", "address",
                "storage_options", "progress", "max_tokens", "window_rows", "device", "on_error",
                "compile", "exact_gelu"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
