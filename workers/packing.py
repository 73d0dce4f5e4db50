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
from workers.encoded import Encoded, gather_index


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


def pack_size(encoded: Encoded, plan: PackPlan) -> int:
    """int64 words of the planned pack's buffer (`Pack.flat_size`)."""
    tokens = int(encoded.lengths[plan.rows].sum())
    return Pack.flat_size(tokens, len(plan.rows), encoded.type_ids is not None)


def build_pack(encoded: Encoded, plan: PackPlan, into: torch.Tensor | None = None) -> Pack:
    """The planned sequences as a CPU `Pack` whose fields are views of one int64 buffer
    (`Pack.from_flat`): `into` (at least `pack_size` words, e.g. reused pinned memory) or
    a new one. A vectorized gather; no per-row Python."""
    lengths = encoded.lengths[plan.rows]  # (B,)
    tokens, typed = int(lengths.sum()), encoded.type_ids is not None
    flat = torch.empty(Pack.flat_size(tokens, len(lengths), typed), dtype=torch.int64) if into is None else into
    pack = Pack.from_flat(flat, tokens, len(lengths), typed, int(lengths.max()))
    index = gather_index(encoded.offsets[:-1][plan.rows], lengths)
    pack.input_ids.numpy()[:] = encoded.ids[index]
    cu = pack.cu_seqlens.numpy()
    cu[0] = 0
    np.cumsum(lengths, out=cu[1:])
    np.subtract(np.arange(tokens, dtype=np.int64), np.repeat(cu[:-1], lengths), out=pack.position_ids.numpy())
    if typed:
        pack.token_type_ids.numpy()[:] = encoded.type_ids[index]
    return pack
