"""Moving packs to the GPU: a ring of reused pinned host buffers, one copy per pack.

A pack's fields are views of one int64 buffer (`Pack.from_flat`), so it crosses to the
device in one non-blocking copy and its device fields are views of one device buffer.
The host buffers are pinned once and reused in turn, instead of pinning each field of each
pack anew: page-locking is a driver call, and pinned copies are what let the launching
thread run ahead of the device. A buffer is refilled only after the copy that last read it
has finished (an event recorded behind that copy), so the launching thread may run
`slots` packs ahead of the device's copies and no further.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from states.interface import Pack
from workers.encoded import Encoded
from workers.packing import PackPlan, build_pack, pack_size


@dataclass
class _Slot:
    buffer: torch.Tensor | None = None  # pinned int64
    copied: torch.cuda.Event = field(default_factory=torch.cuda.Event)  # behind the last copy out of `buffer`


class PinnedStaging:
    """Builds packs into pinned buffers and copies each to `device` on its current stream.

    Not thread-safe: one launching thread uses it at a time (units launch in turn)."""

    def __init__(self, device: torch.device, slots: int = 8) -> None:
        assert device.type == "cuda" and slots > 0
        self.device = device
        self._slots = [_Slot() for _ in range(slots)]
        self._next = 0

    def stage(self, encoded: Encoded, plan: PackPlan) -> Pack:
        """The planned pack on the device; its copy is queued, not waited for."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        slot.copied.synchronize()  # the last copy out of this buffer has read it (no-op before the first)
        words = pack_size(encoded, plan)
        if slot.buffer is None or slot.buffer.numel() < words:
            slot.buffer = torch.empty(1 << max(words - 1, 1).bit_length(), dtype=torch.int64, pin_memory=True)
        host = build_pack(encoded, plan, slot.buffer)
        flat = slot.buffer[:words].to(self.device, non_blocking=True)
        slot.copied.record(torch.cuda.current_stream(self.device))
        typed = host.token_type_ids is not None
        return Pack.from_flat(flat, host.input_ids.numel(), host.num_seqs, typed, host.max_len)
