"""Outputs with a different number of items per row (sparse weights, per-token vectors).

The contract between `Runtime.compute` and the worker: a ragged output of one pack is a
`Ragged`, padded on the device to the pack's widest row so that it is computed and copied
home without a device->host sync (a flat layout would need the total count first). The
worker keeps each pack's `Ragged` apart (widths differ per pack) and flattens them on the
host (`flatten`) into values + per-row lengths, the layout Arrow list columns store; memory
stays bounded by a launch group, like dense outputs.

Where the widest row is known only to the device (a SPLADE row keeps every positive
weight), `Runtime.launch` returns a `Pending` in place of the outputs: the width comes home
without the host waiting for it, and `resolve` later waits for the device to reach that
point only, then queues the padded outputs at that width.
"""

from __future__ import annotations

from collections.abc import Callable
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


class Pending:
    """Ragged outputs of one pack whose width is a device value (`size`, a 0-d integer
    tensor): `resolve()` -> `finish(width)`, the outputs at that width.

    Why: reading the width at once makes the host wait for the pack's whole forward, and
    the device then idles while the host launches the next pack. A worker resolves a launch
    group's pending outputs after it has queued the next group's packs (`workers.unit`), so
    the wait overlaps device work; resolving waits on an event recorded right after the
    width's copy, not on the stream (which would wait for the packs queued since)."""

    def __init__(self, size: torch.Tensor, finish: Callable[[int], dict[str, Ragged]]) -> None:
        self._finish = finish
        self._event: torch.cuda.Event | None = None
        if size.device.type == "cuda":
            self._size = torch.empty((), dtype=size.dtype, pin_memory=True)
            self._size.copy_(size, non_blocking=True)
            self._event = torch.cuda.Event(blocking=True)  # the waiter sleeps, not spins
            self._event.record()
        else:
            self._size = size

    @torch.inference_mode()
    def resolve(self) -> dict[str, Ragged]:
        if self._event is not None:
            self._event.synchronize()
        return self._finish(int(self._size))


def resolve(outputs: dict[str, torch.Tensor | Ragged | Pending]) -> dict[str, torch.Tensor | Ragged]:
    """A pack's outputs (`Runtime.launch`) with each `Pending` replaced by what it resolves to."""
    done: dict[str, torch.Tensor | Ragged] = {}
    for key, value in outputs.items():
        if isinstance(value, Pending):
            done.update(value.resolve())
        else:
            done[key] = value
    return done


def pending(outputs: dict[str, torch.Tensor | Ragged | Pending]) -> bool:
    return any(isinstance(v, Pending) for v in outputs.values())


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
