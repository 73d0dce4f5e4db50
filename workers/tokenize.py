"""Batch tokenization with the Rust tokenizer: no padding, truncation to the model's limit.

`encode_batch` spreads a batch over all host cores (the Python `__call__` path is the
throughput cap otherwise). Each text yields one sequence (truncated, flagged), or with
`chunk=True` its first window plus every overflowing window (each `max_length` long with
special tokens, overlapping the previous by `stride` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer


@dataclass
class Encoded:
    """Token ids of a batch's sequences, unpadded; several per text when chunking."""

    ids: list[np.ndarray]  # M arrays of (L_i,) int64
    type_ids: list[np.ndarray] | None  # M arrays of (L_i,); None for single texts or models without types
    truncated: np.ndarray  # (N,) bool: the text was longer than max_length
    source: np.ndarray  # (M,) int64: index of the text each sequence comes from
    chunk: np.ndarray  # (M,) int32: window number within its text (0 without chunking)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.ids), dtype=np.int64, count=len(self.ids))  # (M,)

    def without_empty(self) -> tuple[Encoded, np.ndarray]:
        """(this batch less zero-token sequences, indices of the texts left with none).

        An empty text through a tokenizer that adds no special tokens (many decoders)
        has nothing to pool; such texts are reported instead of given a garbage vector."""
        lengths = self.lengths
        if lengths.all():
            return self, np.zeros(0, np.int64)
        keep = np.flatnonzero(lengths > 0)
        empty = np.setdiff1d(self.source[lengths == 0], self.source[keep])
        types = None if self.type_ids is None else [self.type_ids[i] for i in keep]
        return Encoded([self.ids[i] for i in keep], types, self.truncated, self.source[keep], self.chunk[keep]), empty


class BatchTokenizer:
    """Wraps a transformers fast tokenizer's backend for unpadded, truncated batches."""

    def __init__(self, hf_tokenizer, max_length: int, prompt: str = "", chunk: bool = False, stride: int = 0) -> None:
        self.backend: Tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self.backend.no_padding()
        try:
            self.backend.enable_truncation(max_length, stride=stride if chunk else 0)
        except Exception as e:
            raise ValueError(f"chunk_stride={stride} must be smaller than max_length={max_length} less special tokens") from e
        self.max_length, self.prompt, self.chunk = max_length, prompt, chunk
        self.with_type_ids = "token_type_ids" in hf_tokenizer.model_input_names

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> Encoded:
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        inputs = texts if pairs is None else list(zip(texts, pairs))
        encodings = self.backend.encode_batch(inputs, add_special_tokens=True)
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        if self.chunk:
            windows = [[e, *e.overflowing] for e in encodings]
            source = np.repeat(np.arange(len(windows)), [len(w) for w in windows])
            chunk = np.concatenate([np.arange(len(w), dtype=np.int32) for w in windows]) if windows else np.zeros(0, np.int32)
            encodings = [e for w in windows for e in w]
        else:
            source, chunk = np.arange(len(encodings)), np.zeros(len(encodings), dtype=np.int32)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        # Single texts have all-zero token types, which is also the models' default: skip them.
        with_types = self.with_type_ids and pairs is not None
        type_ids = [np.asarray(e.type_ids, dtype=np.int64) for e in encodings] if with_types else None
        return Encoded(ids, type_ids, truncated, source.astype(np.int64), chunk)
