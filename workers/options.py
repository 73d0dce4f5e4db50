"""The options `workers/` takes: how a unit is read, batched and written.

Filled from a job by `jobs.spec.JobSpec.unit_options`; nothing under `workers/` sees the
job spec itself, so the worker's contract is this list and the `Runtime` it is handed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOKENIZE_IN = ("auto", "threads", "tasks")


@dataclass(frozen=True)
class UnitOptions:
    output: str  # the job's output directory or URI; shards go to `OUTPUT/data`, quarantine to `OUTPUT/_errors`
    text_column: str = "text"
    pair_column: str | None = None  # the second text of each pair (cross-encoders)
    id_column: str | None = None  # copied to the output; None: a stable `file#row` key
    window_rows: int = 256  # rows tokenized together and sorted by length before packing
    max_tokens: int | None = None  # token budget per forward; None: the runtime's own budget
    overlong: str = "truncate"  # truncate | chunk
    chunk_stride: int = 32
    chunk_aggregate: str = "mean"  # mean | none
    output_dtype: str = "float32"
    on_error: str = "quarantine"  # quarantine | fail
    max_retries: int = 3  # a tokenizing task's retries
    tokenize_in: str = "auto"  # threads | tasks (Ray CPU tasks) | auto: tasks only for a GPU worker without a fast tokenizer
    storage_options: dict[str, Any] = field(default_factory=dict)  # pyarrow.fs options for URIs
    dedup: bool = True  # rows with the same content are computed once (`workers.dedup`); reuse needs it too
    dedup_cache_mb: int = 1024  # a worker's computed outputs kept for later units' copies
