"""The options `states/` takes, and the names they may hold (torch-free: the front door
validates against these before anything heavy is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Task = Literal["embed", "classify", "score"]
TASKS: tuple[str, ...] = get_args(Task)
DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16")
PoolingMode = Literal["cls", "mean", "max", "last", "mean_sqrt_len", "weighted_mean"]
POOLING_MODES: tuple[str, ...] = get_args(PoolingMode)
Execution = Literal["auto", "packed", "padded"]
EXECUTIONS: tuple[str, ...] = get_args(Execution)
COMPILE_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class ModelOptions:
    """How to load and run the model. `None` / "auto" fields resolve from the model."""

    model: str
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
