"""Token-budget packing: sort a window of rows by length, cut it into packs.

Sorting keeps each pack's sequences of similar length, so the padded path wastes little
and the packed path's attention blocks are even; callers restore row order from
`PackPlan.rows`. The budget bounds what the device holds: `rows x longest row` on the
padded path, the real tokens on the packed path (varlen attention is linear in them), so
a packed launch group stays one pack instead of a full pack and a small remainder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from states.interface import Pack
from workers.tokenize import Encoded


@dataclass
class PackPlan:
    rows: np.ndarray  # (B,) indices into the window, longest first


def plan_packs(lengths: np.ndarray, max_tokens: int, max_seqs: int, packed: bool = False) -> list[PackPlan]:
    """lengths (N,) -> packs of at most `max_seqs` rows within `max_tokens`: counting
    `count * longest` (padded), or the rows' own tokens (`packed`)."""
    assert max_tokens > 0 and max_seqs > 0
    order = np.argsort(-lengths, kind="stable")  # longest first
    ends = np.cumsum(lengths[order])  # tokens of the sorted rows up to each
    plans, start = [], 0
    while start < len(order):
        if packed:  # rows whose running total, from this pack's first, fits
            fits = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + max_tokens, side="right")) - start
        else:
            fits = max_tokens // max(int(lengths[order[start]]), 1)
        count = max(1, min(max_seqs, fits, len(order) - start))
        plans.append(PackPlan(order[start : start + count]))
        start += count
    return plans


def build_pack(encoded: Encoded, plan: PackPlan) -> Pack:
    """The planned sequences as a CPU `Pack` (a vectorized gather; no per-row Python)."""
    picked = encoded.select(plan.rows)
    lengths = picked.lengths  # (B,)
    positions = np.arange(len(picked.ids), dtype=np.int64) - np.repeat(picked.offsets[:-1], lengths)  # (T,)
    types = None if picked.type_ids is None else torch.from_numpy(picked.type_ids.astype(np.int64))
    return Pack(
        input_ids=torch.from_numpy(picked.ids.astype(np.int64)),
        position_ids=torch.from_numpy(positions),
        token_type_ids=types,
        cu_seqlens=torch.from_numpy(picked.offsets.astype(np.int32)),
        max_len=int(lengths.max()),
    )
