"""Batch tokenization with the Rust tokenizer: no padding, truncation to the model's limit.

Output is flat: all token ids of a window in one int32 array plus offsets, so it crosses
process boundaries (Ray's object store) as two buffers, and packing is a vectorized
gather instead of per-row Python. Each text yields one sequence (truncated, flagged), or
with `chunk=True` its first window plus every overflowing window (each `max_length` long
with special tokens, overlapping the previous by `stride` tokens).

BERT-family tokenizers take plain text through `workers.plain_text`'s twin: the same ids,
faster.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import asdict, dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from workers.plain_text import PlainTwin


@dataclass
class Encoded:
    """Token ids of a batch's sequences, unpadded and flat; several per text when chunking."""

    ids: np.ndarray  # (T,) int32: every sequence's ids, back to back
    offsets: np.ndarray  # (M+1,) int64: sequence m is ids[offsets[m]:offsets[m+1]]
    type_ids: np.ndarray | None  # (T,) int32; None for single texts or models without types
    truncated: np.ndarray  # (N,) bool: the text was longer than max_length
    source: np.ndarray  # (M,) int64: index of the text each sequence comes from
    chunk: np.ndarray  # (M,) int32: window number within its text (0 without chunking)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)  # (M,)

    def sequence(self, m: int) -> np.ndarray:
        return self.ids[self.offsets[m] : self.offsets[m + 1]]

    def select(self, seqs: np.ndarray) -> Encoded:
        """These sequences only (texts keep their numbering)."""
        lengths = self.lengths[seqs]
        index = gather_index(self.offsets[:-1][seqs], lengths)
        offsets = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        types = None if self.type_ids is None else self.type_ids[index]
        return Encoded(self.ids[index], offsets, types, self.truncated, self.source[seqs], self.chunk[seqs])

    def without_empty(self) -> tuple[Encoded, np.ndarray]:
        """(this batch less zero-token sequences, indices of the texts left with none).

        An empty text through a tokenizer that adds no special tokens (many decoders)
        has nothing to pool; such texts are reported instead of given a garbage vector."""
        lengths = self.lengths
        if lengths.all():
            return self, np.zeros(0, np.int64)
        keep = np.flatnonzero(lengths > 0)
        return self.select(keep), np.setdiff1d(self.source[lengths == 0], self.source[keep])


def gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat positions of the segments [starts[i], starts[i] + lengths[i]), in order."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


def _flatten(encodings: list[Encoding], field: str) -> np.ndarray:
    total = sum(len(e) for e in encodings)
    return np.fromiter(itertools.chain.from_iterable(getattr(e, field) for e in encodings), np.int32, total)


class BatchTokenizer:
    """Unpadded, truncated batches from a `tokenizers.Tokenizer` (a fast tokenizer's backend).

    Built from the backend's JSON, so it can be sent to tokenizing processes as a string."""

    def __init__(self, backend_json: str, max_length: int, with_type_ids: bool, prompt: str = "",
                 chunk: bool = False, stride: int = 0) -> None:
        self.backend: Tokenizer = Tokenizer.from_str(backend_json)
        self.backend.no_padding()
        try:
            self.backend.enable_truncation(max_length, stride=stride if chunk else 0)
        except Exception as e:
            raise ValueError(f"chunk_stride={stride} must be smaller than max_length={max_length} less special tokens") from e
        self.plain = PlainTwin.of(self.backend)
        self.prompt, self.chunk, self.with_type_ids = prompt, chunk, with_type_ids

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> Encoded:
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        inputs = texts if pairs is None else list(zip(texts, pairs))
        encodings = self._encode(inputs)
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
        types = _flatten(encodings, "type_ids") if self.with_type_ids and pairs is not None else None
        return Encoded(_flatten(encodings, "ids"), offsets, types, truncated, source.astype(np.int64), chunk)

    def _encode(self, inputs: list) -> list[Encoding]:
        """Encodings in input order, plain texts through the twin. `_fast` skips character
        offsets, which pooling never uses: ~20% faster."""
        forms = [None] * len(inputs) if self.plain is None else [self.plain.form(x) for x in inputs]
        twin = [i for i, f in enumerate(forms) if f is not None]
        if not twin:
            return self.backend.encode_batch_fast(inputs, add_special_tokens=True)
        if len(twin) == len(inputs):
            return self.plain.backend.encode_batch_fast(forms, add_special_tokens=True)
        own = [i for i, f in enumerate(forms) if f is None]
        encodings: list[Encoding] = [None] * len(inputs)  # type: ignore[list-item]
        for rows, done in ((twin, self.plain.backend.encode_batch_fast([forms[i] for i in twin], add_special_tokens=True)),
                           (own, self.backend.encode_batch_fast([inputs[i] for i in own], add_special_tokens=True))):
            for i, e in zip(rows, done):
                encodings[i] = e
        return encodings


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything needed to build a `BatchTokenizer`, here or in another process."""

    backend_json: str
    max_length: int
    with_type_ids: bool
    prompt: str = ""
    chunk: bool = False
    stride: int = 0

    @classmethod
    def from_hf(cls, hf_tokenizer, max_length: int, prompt: str = "", chunk: bool = False, stride: int = 0) -> TokenizerSpec:
        """From a transformers fast tokenizer (its Rust backend, serialized)."""
        return cls(hf_tokenizer.backend_tokenizer.to_str(), max_length, "token_type_ids" in hf_tokenizer.model_input_names,
                   prompt, chunk, stride)

    def build(self) -> BatchTokenizer:
        return BatchTokenizer(**asdict(self))

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(asdict(self)).encode()).hexdigest()


@dataclass
class EncodedWindow:
    """A window's tokenization: the encoded rows, and the rows that have none, with why."""

    encoded: Encoded  # sequences' `source` index into `kept`
    kept: np.ndarray  # (K,) int64: the window's row numbers that were encoded
    rejected: dict[int, str]  # row number -> reason
    seconds: float  # time spent tokenizing

    @property
    def tokens(self) -> int:
        return int(self.encoded.offsets[-1])

    @classmethod
    def concat(cls, windows: list[EncodedWindow]) -> EncodedWindow:
        """Consecutive windows as one, so they can share packs (texts renumbered)."""
        if len(windows) == 1:
            return windows[0]
        encs = [w.encoded for w in windows]
        text_shift = np.cumsum([0] + [len(w.kept) for w in windows[:-1]])
        token_shift = np.cumsum([0] + [int(e.offsets[-1]) for e in encs[:-1]])
        encoded = Encoded(
            np.concatenate([e.ids for e in encs]),
            np.concatenate([[0]] + [e.offsets[1:] + s for e, s in zip(encs, token_shift)]).astype(np.int64),
            None if encs[0].type_ids is None else np.concatenate([e.type_ids for e in encs]),
            np.concatenate([e.truncated for e in encs]),
            np.concatenate([e.source + s for e, s in zip(encs, text_shift)]),
            np.concatenate([e.chunk for e in encs]),
        )
        rejected = {row: why for w in windows for row, why in w.rejected.items()}
        return cls(encoded, np.concatenate([w.kept for w in windows]), rejected, sum(w.seconds for w in windows))


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
