"""What `workers/` may ask of a loaded model: the runtime contract.

`states.runtime.Runtime` implements it; a worker depends on nothing else of a model
(no reaching into its state, config or modules), so model-specific code stays in `states/`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from states.interface import Pack
from states.ragged import Pending, Ragged


class WorkerRuntime(Protocol):
    # Tokenizing: a transformers fast tokenizer, the longest sequence the model takes
    # (special tokens included), the prompt put before every text.
    tokenizer: object
    max_length: int
    prompt: str

    # Compute: where packs run, whether they run packed (varlen) or padded.
    device: torch.device
    packed: bool

    # Output schema: each output's per-row shape (what a unit with no usable row still
    # writes; per item for the ragged ones), the outputs of a variable number of items per
    # row (sparse, multivector: `states.ragged.Ragged`), class labels (classify), int8/uint8
    # calibration ranges, L2 normalization.
    output_shapes: dict[str, tuple[int, ...]]
    ragged: frozenset[str]
    labels: list[str] | None
    ranges: np.ndarray | None
    normalize: bool

    def launch(self, pack: Pack) -> dict[str, torch.Tensor | Ragged | Pending]:
        """One pack, already on `device` -> the task's outputs, each (B, ...) float32 or a
        `Ragged` (B rows of a variable number of items), queued on the device without
        waiting for it; outputs whose width only the device knows come as a `Pending`
        (`states.ragged.resolve` gives them, waiting for the device that far)."""
        ...

    def token_budget(self) -> int:
        """Tokens one forward may hold (the padded path counts padding)."""
        ...

    def provenance(self) -> dict[str, str]:
        """The settings that determine the output values, as resolved."""
        ...

    def fingerprint(self) -> str:
        """A hash of the model's files."""
        ...
