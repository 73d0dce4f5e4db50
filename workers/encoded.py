"""Tokenized text as the worker moves it: flat int32 ids plus row offsets.

Flat arrays cross process boundaries (Ray's object store) as a few buffers, and packing
is a vectorized gather instead of per-row Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
