"""Outputs with a different number of items per row (sparse weights, per-token vectors).

The contract between `Runtime.compute` and the worker: a ragged output of one pack is a
`Ragged`, padded on the device to the pack's widest row so that it is computed and copied
home without a device->host sync (a flat layout would need the total count first). The
worker keeps each pack's `Ragged` apart (widths differ per pack) and flattens them on the
host (`flatten`) into values + per-row lengths, the layout Arrow list columns store; memory
stays bounded by a launch group, like dense outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Ragged:
    """Row b holds `padded[b, :lengths[b]]`; what lies after is padding."""

    padded: torch.Tensor  # (B, K, ...) K: the widest row of the pack
    lengths: torch.Tensor  # (B,) int64

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.padded.shape)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Ragged:
        return Ragged(self.padded.to(device, non_blocking=non_blocking),
                      self.lengths.to(device, non_blocking=non_blocking))

    @classmethod
    def empty(cls, item_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Ragged:
        return cls(torch.zeros((0, 0, *item_shape), dtype=dtype), torch.zeros(0, dtype=torch.int64))


def flatten(parts: list[Ragged]) -> tuple[np.ndarray, np.ndarray]:
    """Packs' ragged outputs (on the host) -> (values (N, ...), lengths (B,)): every row's
    items back to back, rows in pack order."""
    values, lengths = [], []
    for part in parts:
        n = part.lengths.numpy()
        padded = part.padded.numpy()
        keep = np.arange(padded.shape[1])[None, :] < n[:, None]  # (B, K)
        values.append(padded[keep])
        lengths.append(n)
    return np.concatenate(values), np.concatenate(lengths).astype(np.int64)


def take(values: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `order` of a flat ragged array (values (N, ...), lengths (B,)), in that order."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    picked = lengths[order]
    starts = np.repeat(offsets[:-1][order], picked)  # (N',) each item's row start
    within = np.arange(picked.sum()) - np.repeat(np.cumsum(picked) - picked, picked)  # (N',) position in its row
    return values[starts + within], picked
