"""Batch tokenization with the Rust tokenizer: no padding, truncation to the model's limit.

`encode_batch` spreads a batch over all host cores (the Python `__call__` path is the
throughput cap otherwise). Rows come back as id arrays plus whether each was truncated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


@dataclass
class Encoded:
    """Token ids of a batch of rows, unpadded."""

    ids: list[np.ndarray]  # N arrays of (L_i,) int64
    type_ids: list[np.ndarray] | None  # N arrays of (L_i,), or None when the model takes none
    truncated: np.ndarray  # (N,) bool

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.ids), dtype=np.int64, count=len(self.ids))  # (N,)


class BatchTokenizer:
    """Wraps a transformers fast tokenizer's backend for unpadded, truncated batches."""

    def __init__(self, hf_tokenizer, max_length: int, prompt: str = "") -> None:
        self.backend: Tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self.backend.no_padding()
        self.backend.enable_truncation(max_length)
        self.max_length = max_length
        self.prompt = prompt
        self.with_type_ids = "token_type_ids" in hf_tokenizer.model_input_names

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> Encoded:
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        inputs = texts if pairs is None else list(zip(texts, pairs))
        encodings = self.backend.encode_batch(inputs, add_special_tokens=True)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        type_ids = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings] if self.with_type_ids else None
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        return Encoded(ids, type_ids, truncated)
