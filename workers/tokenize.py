"""Batch tokenization: no padding, truncation to the model's limit, flat output.

Each text yields one sequence (truncated, flagged), or with `chunk=True` its first window
plus every overflowing window (each `max_length` long with special tokens, overlapping the
previous by `stride` tokens). Without chunking, texts go through the spec's `backend`
(`workers.token_backends`: nanotoken, gigatoken or HF `tokenizers`): single texts each cut
to a bounded prefix first where that is exact (`bounded`), text pairs whole, both sides
truncated as HF's `longest_first` (`PairTemplate`; a pair's kept tokens depend on both
whole lengths, so pairs are never cut). Chunking takes HF `tokenizers` with its own
truncation, the reference every backend is checked against (`workers.tokenizer_choice`).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
from tokenizers import Encoding, Tokenizer

from workers.encoded import Encoded, EncodedWindow, gather_index
from workers.token_backends import CONTENT_BACKENDS, PairTemplate, Wrapped, bounded, special_tokens

__all__ = ["BatchTokenizer", "Encoded", "EncodedWindow", "TokenizerSpec", "encode_window", "gather_index"]

REFERENCE = "reference"  # the backend name of HF `tokenizers` with its own truncation, texts whole


def _flatten(encodings: list[Encoding], field: str) -> np.ndarray:
    total = sum(len(e) for e in encodings)
    return np.fromiter(itertools.chain.from_iterable(getattr(e, field) for e in encodings), np.int32, total)


class BatchTokenizer:
    """Unpadded, truncated batches of a model's tokenizer (its `tokenizers` JSON, so it
    can be sent to tokenizing processes as a string)."""

    def __init__(self, backend_json: str, max_length: int, with_type_ids: bool, prompt: str = "",
                 chunk: bool = False, stride: int = 0, backend: str = REFERENCE, bounded: bool = True,
                 pairs: bool = False) -> None:
        self.reference: Tokenizer = Tokenizer.from_str(backend_json)
        self.reference.no_padding()
        try:
            self.reference.enable_truncation(max_length, stride=stride if chunk else 0)
        except Exception as e:
            raise ValueError(f"chunk_stride={stride} must be smaller than max_length={max_length} less special tokens") from e
        self.prompt, self.chunk, self.with_type_ids, self.max_length = prompt, chunk, with_type_ids, max_length
        self.backend, self.bounded = backend, bounded
        self.pair_template: PairTemplate | None = None
        if backend != REFERENCE and not chunk:
            self.content = CONTENT_BACKENDS[backend](backend_json)
            self.wrap = Wrapped(*special_tokens(backend_json), max_length)
            if pairs:
                self.pair_template = PairTemplate.of(backend_json)

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> Encoded:
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        if pairs is None and not self.chunk and self.backend != REFERENCE:
            return bounded(self._single, texts, self.max_length) if self.bounded else self._single(texts)
        if pairs is not None and self.pair_template is not None:
            return self._pairs(texts, pairs)
        return self._reference(texts if pairs is None else list(zip(texts, pairs)), pairs is not None)

    def _pairs(self, texts: list[str], pairs: list[str]) -> Encoded:
        enc = self.pair_template.encode(self.content(texts), self.content(pairs), self.max_length)
        return enc if self.with_type_ids else replace(enc, type_ids=None)

    def _single(self, texts: list[str]) -> Encoded:
        return self.wrap(self.content(texts))

    def _reference(self, inputs: list, paired: bool) -> Encoded:
        """HF `tokenizers` on whole texts. `_fast` skips character offsets, which pooling never uses."""
        encodings = self.reference.encode_batch_fast(inputs, add_special_tokens=True)
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        if self.chunk:
            windows = [[e, *e.overflowing] for e in encodings]
            source = np.repeat(np.arange(len(windows)), [len(w) for w in windows])
            chunk = np.concatenate([np.arange(len(w), dtype=np.int32) for w in windows]) if windows else np.zeros(0, np.int32)
            encodings = [e for w in windows for e in w]
        else:
            source, chunk = np.arange(len(encodings)), np.zeros(len(encodings), dtype=np.int32)
        offsets = np.zeros(len(encodings) + 1, np.int64)
        np.cumsum(np.fromiter((len(e) for e in encodings), np.int64, len(encodings)), out=offsets[1:])
        # Single texts have all-zero token types, which is also the models' default: skip them.
        types = _flatten(encodings, "type_ids") if self.with_type_ids and paired else None
        return Encoded(_flatten(encodings, "ids"), offsets, types, truncated, source.astype(np.int64), chunk)


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to build a `BatchTokenizer`, here or in another process."""

    backend_json: str
    max_length: int
    with_type_ids: bool
    prompt: str = ""
    chunk: bool = False
    stride: int = 0
    backend: str = REFERENCE  # single texts' backend: a `token_backends.CONTENT_BACKENDS` name, or REFERENCE
    bounded: bool = True  # the backend takes texts cut to a bounded prefix (`token_backends.bounded`)
    pairs: bool = False  # it tokenizes text pairs (checked as pairs; a fast backend uses a `PairTemplate`)

    @classmethod
    def from_hf(cls, hf_tokenizer, max_length: int, prompt: str = "", chunk: bool = False, stride: int = 0,
                pairs: bool = False) -> TokenizerSpec:
        """From a transformers fast tokenizer (its Rust backend, serialized); the reference backend."""
        return cls(hf_tokenizer.backend_tokenizer.to_str(), max_length, "token_type_ids" in hf_tokenizer.model_input_names,
                   prompt, chunk, stride, pairs=pairs)

    def build(self) -> BatchTokenizer:
        return BatchTokenizer(**asdict(self))

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(asdict(self)).encode()).hexdigest()


def encode_window(tokenize: BatchTokenizer, rows: np.ndarray, texts: list[str], pairs: list[str] | None) -> EncodedWindow:
    """Tokenize one window of rows (`texts[i]` is row `rows[i]`). Rows the tokenizer
    rejects are found one by one and reported; so are rows left with no tokens."""
    t = time.perf_counter()
    try:
        enc, bad, why = tokenize(texts, pairs), [], []
    except Exception:  # the Rust tokenizer names no row: find them
        keep, bad, why = [], [], []
        for i, text in enumerate(texts):
            try:
                tokenize([text], None if pairs is None else [pairs[i]])
                keep.append(i)
            except Exception as e:
                bad.append(i), why.append(f"tokenizer rejected the row: {e}")
        enc = tokenize([texts[i] for i in keep], None if pairs is None else [pairs[i] for i in keep])
    kept = np.delete(rows, bad)
    enc, empty = enc.without_empty()
    rejected = dict(zip(rows[bad].tolist(), why))
    rejected.update({int(kept[i]): "no tokens (empty text, and the tokenizer adds no special tokens)" for i in empty})
    return EncodedWindow(enc, kept, rejected, time.perf_counter() - t)
