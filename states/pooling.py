"""Pooling over packed hidden states, and the embedding post-processing after it.

Every execution path ends in the packed layout `(T, H)` + `cu_seqlens`, so there is one
implementation per mode (padded paths convert with `interface.from_padded` first). Modes
and their semantics follow sentence-transformers' `Pooling` module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from states.options import POOLING_MODES, PoolingMode



def check_mode(mode: str) -> str:
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling={mode!r} is not a pooling mode; choose one of {POOLING_MODES} or 'auto'")
    return mode


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """hidden (T, H), cu_seqlens (B+1,) -> pooled (B, H) in float32."""
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()  # (B,)
    if mode == "cls":
        return hidden[starts].float()
    if mode == "last":
        return hidden[ends - 1].float()
    lengths = ends - starts  # (B,)
    seg = torch.repeat_interleave(  # output_size avoids a device->host sync
        torch.arange(lengths.numel(), device=hidden.device), lengths, output_size=hidden.shape[0]
    )  # (T,)
    h = hidden.float()
    if mode == "max":
        out = torch.full((lengths.numel(), h.shape[1]), float("-inf"), device=h.device)
        return out.scatter_reduce_(0, seg[:, None].expand_as(h), h, reduce="amax")
    if mode == "weighted_mean":  # weights 1..L by position, as sentence-transformers
        weights = (torch.arange(h.shape[0], device=h.device) - starts[seg] + 1).float()  # (T,)
        summed = torch.zeros(lengths.numel(), h.shape[1], device=h.device).index_add_(0, seg, h * weights[:, None])
        total = torch.zeros(lengths.numel(), device=h.device).index_add_(0, seg, weights)
        return summed / total[:, None]
    summed = torch.zeros(lengths.numel(), h.shape[1], device=h.device).index_add_(0, seg, h)  # (B, H)
    if mode == "mean":
        return summed / lengths[:, None].float()
    if mode == "mean_sqrt_len":
        return summed / lengths[:, None].float().sqrt()
    raise ValueError(f"pooling={mode!r}; choose one of {POOLING_MODES}")


def finish(pooled: torch.Tensor, normalize: bool, dim: int | None) -> torch.Tensor:
    """Matryoshka truncation to `dim` first, then L2 normalization (so truncated
    embeddings are unit length again). pooled: (B, H) -> (B, dim or H)."""
    if dim is not None:
        if dim > pooled.shape[1]:
            raise ValueError(f"dim={dim} exceeds the model's embedding size {pooled.shape[1]}")
        pooled = pooled[:, :dim]
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled
