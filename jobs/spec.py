"""The job spec: one definition behind CLI flags, YAML job files and the notebook API.

A pydantic model, strict and closed: a YAML `normalize: "false"` or `max_retries: '3'` is
an error naming the key (never a truthy string), an unknown key is an error that suggests
the nearest option, and a choice outside its list names the valid ones. Every failure is
a `SpecError` (a ValueError) with one line a user can act on; the CLI prints it and exits
2. Each field's `description` is its help text and `choices` its valid values, which
`jobs.cli` turns into flags. Local `input`, `output` and `model` paths are made absolute
here, so `_job.json` records where the job really read and wrote.

This module imports no torch: `--help` and option errors answer before anything heavy loads.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from dataclasses import fields as dataclass_fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

from states.options import (
    CALIBRATED_DTYPES, COMPILE_CHOICES, DTYPE_NAMES, EXECUTIONS, MULTIVECTOR_DTYPES, OUTPUT_DTYPES, POOLING_MODES, TASKS,
    ModelOptions, parse_outputs,
)
from workers.options import TOKENIZE_IN, UnitOptions

INPUT_FORMATS = ("auto", "parquet", "ipc", "jsonl", "csv")
OVERLONG = ("truncate", "chunk")
CHUNK_AGGREGATE = ("mean", "none")
ON_ERROR = ("quarantine", "fail")
BACKENDS = ("auto", "ray", "local")
# Names the output shards themselves use: an id column of one of these names would be lost.
OUTPUT_COLUMNS = ("embedding", "sparse_indices", "sparse_values", "multivector", "label", "probs", "logits", "score",
                  "chunk", "row_key", "error", "content_hash")
# Options that change what an output row holds: `--reuse` refuses an output written under
# other values of them (the workers then compare each shard's resolved provenance too).
OUTPUT_OPTIONS = ("task", "pooling", "normalize", "dim", "output_dtype", "max_length", "overlong", "chunk_stride",
                  "chunk_aggregate", "prompt_name", "dtype", "state", "route", "outputs", "sparse_top_k",
                  "sparse_threshold")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # `org/name`, as sentence-transformers users type models


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    extra = {"choices": choices} if choices else None
    if isinstance(default, (list, dict)):
        return Field(default_factory=lambda: type(default)(default), description=help, json_schema_extra=extra)
    return Field(default, description=help, json_schema_extra=extra)


class SpecError(ValueError):
    """A job option is invalid; the message names the option."""


class JobSpec(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    input: str | list[str] = _f("", "input file, directory, glob or URI (s3://, gs://); a list in YAML")
    output: str = _f("", "output directory or URI for shards, manifest and report")
    model: str = _f("", "model directory (transformers / sentence-transformers layout) or hub id (org/name)")
    task: str = _f("embed", "what to compute", TASKS)
    input_format: str = _f("auto", "input format; auto detects it from the file extension", INPUT_FORMATS)
    text_column: str = _f("text", "column holding the text")
    pair_column: str | None = _f(None, "second text column for pair scoring (cross-encoders)")
    id_column: str | None = _f(None, "column copied to the output as the row id; default: a stable row key")
    pooling: str = _f("auto", "pooling mode; auto reads the sentence-transformers config", ("auto", *POOLING_MODES))
    normalize: bool | None = _f(None, "L2-normalize embeddings (default: as the model's config says)")
    dim: PositiveInt | None = _f(None, "Matryoshka truncation to this many dimensions (renormalized when normalizing)")
    output_dtype: str = _f("float32", "embedding storage type, as sentence-transformers' quantize_embeddings: "
                           "int8/uint8 (calibrated ranges), ubinary (sign bits 8 per byte), binary (ubinary - 128)",
                           OUTPUT_DTYPES)
    max_length: PositiveInt | None = _f(None, "truncate texts to this many tokens (default: the model's limit)")
    overlong: str = _f("truncate", "texts over max_length: truncate them (counted), or split them into windows", OVERLONG)
    chunk_stride: NonNegativeInt = _f(32, "with overlong=chunk: tokens each window shares with the previous one")
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
    unit_rows: PositiveInt = _f(50_000, "rows per work unit (one output shard each)")
    limit: PositiveInt | None = _f(None, "try the job on its first N rows: only the units holding them run (whole "
                                   "Parquet row groups; other formats whole files)")
    window_rows: PositiveInt = _f(256, "rows tokenized together (one CPU task on GPU workers) and sorted by length before packing")
    max_tokens: PositiveInt | None = _f(None, "token budget per forward (default: sized from free device memory)")
    num_workers: PositiveInt | None = _f(None, "actors to start (default: one per GPU, or one CPU worker without GPUs)")
    max_retries: NonNegativeInt = _f(3, "times a failing unit is retried before it is recorded as failed")
    tokenize_in: str = _f("auto", "where a worker tokenizes: threads of its own, or Ray CPU tasks (spread over the "
                          "cluster's CPUs); auto: threads, except tasks for a GPU worker without an exact fast tokenizer",
                          TOKENIZE_IN)
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
    outputs: str = _f("auto", "what to write per row, comma-separated from one forward: dense (embedding), sparse "
                      "(SPLADE: sparse_indices, sparse_values), multivector (per-token vectors); auto: what the model "
                      "was saved as (SentenceTransformer, SparseEncoder, MultiVectorEncoder)")
    sparse_top_k: PositiveInt | None = _f(None, "sparse output: keep each row's k largest weights")
    sparse_threshold: float | None = _f(None, "sparse output: keep only weights above this")
    dedup: bool = _f(True, "compute each distinct input once: rows whose text (and pair) repeat are copied from "
                     "the first; --no-dedup computes every row and turns --reuse off")
    dedup_cache_mb: NonNegativeInt = _f(1024, "MiB of computed outputs each worker keeps for copies into later units")
    reuse: str | None = _f(None, "a previous output directory or URI: rows whose content hash it holds, written with "
                           "the same model and output options, are copied from it instead of computed")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise SpecError(describe(e)) from None
        self._check()

    @field_validator("input", "output", "reuse")
    @classmethod
    def _absolute(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is None:
            return None
        if isinstance(value, list):
            return [absolute(v) for v in value]
        return absolute(value)

    @field_validator("model")
    @classmethod
    def _model_path(cls, value: str) -> str:
        """A local directory becomes absolute; an `org/name` that is no local path stays a hub id."""
        local = os.path.expanduser(value)
        if not os.path.exists(local) and HUB_ID.fullmatch(value):
            return value
        return absolute(value)

    def _check(self) -> None:
        """Rules between fields, after each field has its type."""
        for name in ("input", "output", "model"):
            if not getattr(self, name):
                raise SpecError(f"{name} is required (--{name} or `{name}:` in the job file)")
        for name in type(self).model_fields:
            valid, value = choices(name), getattr(self, name)
            if valid and value is not None and value not in valid:
                raise SpecError(f"{name}={value!r} is not valid; choose one of {list(valid)}{did_you_mean(value, valid)}")
        if not DEVICE.fullmatch(self.device):
            raise SpecError(f"device={self.device!r} is not valid; choose auto, cpu, cuda or cuda:N")
        if self.overlong == "chunk" and self.task != "embed":
            raise SpecError(f"overlong='chunk' works with task 'embed' only (got task {self.task!r})")
        if self.task == "score" and not self.pair_column:
            raise SpecError("task 'score' needs pair_column (the second text of each pair)")
        if self.output_dtype in ("binary", "ubinary") and self.dim is not None and self.dim % 8:
            raise SpecError(f"output_dtype {self.output_dtype!r} packs 8 dimensions per byte; "
                            f"dim={self.dim} is not a multiple of 8")
        if self.output_dtype in CALIBRATED_DTYPES and self.calibration is None and self.task == "embed":
            raise SpecError(f"output_dtype {self.output_dtype!r} buckets each dimension's calibrated range into "
                            "256 steps: pass calibration=FILE.npy (the (2, dim) ranges, or sample embeddings)")
        self._check_outputs()
        if self.reuse is not None and self.reuse.rstrip("/") == self.output.rstrip("/"):
            raise SpecError("reuse must name another output than output: a job's own output is resumed, "
                            "not reused (write the new run to a new directory)")
        if self.reuse is not None and not self.dedup:
            raise SpecError("reuse copies rows by content hash, which --no-dedup turns off; drop one of them")
        if self.id_column in OUTPUT_COLUMNS:
            raise SpecError(f"id_column={self.id_column!r} is a column name the output itself uses "
                            f"({', '.join(OUTPUT_COLUMNS)}); copy the ids to a column of another name")

    def _check_outputs(self) -> None:
        if self.outputs == "auto":
            return
        try:
            kinds = parse_outputs(self.outputs)
        except ValueError as e:
            raise SpecError(str(e)) from None
        if self.task != "embed" and kinds != ("dense",):
            raise SpecError(f"outputs={self.outputs!r} is for task 'embed' (got task {self.task!r})")
        if self.overlong == "chunk" and self.chunk_aggregate == "mean" and kinds != ("dense",):
            raise SpecError("chunk_aggregate='mean' averages dense embeddings only; with sparse or multivector "
                            "outputs use chunk_aggregate='none' (one row per window)")
        if "sparse" not in kinds and (self.sparse_top_k is not None or self.sparse_threshold is not None):
            raise SpecError(f"sparse_top_k and sparse_threshold apply to sparse output; outputs={self.outputs!r}")
        if "multivector" in kinds and self.output_dtype not in MULTIVECTOR_DTYPES:
            raise SpecError(f"multivector output is stored as {MULTIVECTOR_DTYPES}; output_dtype="
                            f"{self.output_dtype!r} does not apply to it")

    @classmethod
    def from_mapping(cls, values: dict[str, Any], source: str | None = None) -> JobSpec:
        """A spec from a mapping of option names (YAML, the notebook API); `source`
        (a job file's path) prefixes the error message."""
        try:
            return cls(**values)
        except SpecError as e:
            raise SpecError(f"{source}: {e}" if source else str(e)) from None

    def replace(self, **changes: Any) -> JobSpec:
        return type(self)(**{**dict(self), **changes})

    @property
    def model_options(self) -> ModelOptions:
        return ModelOptions(**{f.name: getattr(self, f.name) for f in dataclass_fields(ModelOptions)})

    @property
    def unit_options(self) -> UnitOptions:
        return UnitOptions(**{f.name: getattr(self, f.name) for f in dataclass_fields(UnitOptions)})

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The options that change output values or layout; a resume must match them."""
        skip = {"input", "output", "num_workers", "max_retries", "overwrite", "backend", "address",
                "storage_options", "progress", "max_tokens", "window_rows", "device", "on_error",
                "compile", "exact_gelu", "tokenize_in", "dedup", "dedup_cache_mb", "reuse"}
        return {name: getattr(self, name) for name in type(self).model_fields if name not in skip}


def choices(name: str) -> tuple | None:
    """The valid values of option `name`, or None when any value of its type goes."""
    return (JobSpec.model_fields[name].json_schema_extra or {}).get("choices")


def value_type(name: str) -> type:
    """Option `name`'s value type without None and constraints (`int` for `PositiveInt | None`)."""
    kind = JobSpec.model_fields[name].annotation
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:
        kind = args[0]
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return kind


def absolute(path: str) -> str:
    """A local path made absolute (`~` expanded); URIs (`s3://...`) and "" (missing) unchanged."""
    return path if not path or "://" in path else os.path.abspath(os.path.expanduser(path))


def did_you_mean(value: object, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(str(value), list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_TYPE_NAMES = {"bool_type": "true or false (unquoted in YAML)", "int_type": "an integer", "string_type": "a string",
               "dict_type": "a mapping", "list_type": "a list", "float_type": "a number"}


def describe(error: ValidationError) -> str:
    """One line for all of a validation's errors, each naming its option and what it takes."""
    errors: dict[str, list[dict]] = {}  # option -> its errors (a union's members each report one)
    for e in error.errors():
        errors.setdefault(str(e["loc"][0]) if e["loc"] else "options", []).append(e)
    return "; ".join(_describe_option(name, found) for name, found in errors.items())


def _describe_option(name: str, errors: list[dict]) -> str:
    value, kind = errors[0].get("input"), errors[0]["type"]
    if kind == "extra_forbidden":
        return f"unknown key {name!r}" + (did_you_mean(name, JobSpec.model_fields)
                                          or f"; valid keys: {', '.join(JobSpec.model_fields)}")
    if kind == "greater_than":
        return f"{name}={value!r} must be a positive integer"
    if kind == "greater_than_equal":
        return f"{name}={value!r} must be >= 0"
    if kind in _TYPE_NAMES:
        expected = " or ".join(dict.fromkeys(_TYPE_NAMES[e["type"]] for e in errors if e["type"] in _TYPE_NAMES))
        return f"{name}={value!r} ({type(value).__name__}) must be {expected}"
    return f"{name}={value!r}: {errors[0]['msg']}"
