"""Pooling over packed hidden states, and the embedding post-processing after it.

Every execution path ends in the packed layout `(T, H)` + `cu_seqlens`, so there is one
implementation per mode (padded paths convert with `interface.from_padded` first). Modes,
their names and semantics follow sentence-transformers' `Pooling` module, including
several modes concatenated in order and `include_prompt=False` (the first
`prompt_length` tokens of each sequence left out, positions kept for weightedmean).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from states.options import canonical_pooling


def check_mode(mode: str) -> str:
    """sentence-transformers' name of `mode` (aliases accepted); ValueError otherwise."""
    return canonical_pooling(mode)


def _pool_one(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str, skip: int) -> torch.Tensor:
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()  # (B,)
    if mode == "cls":  # with the prompt left out: the first token after it (none after: the first)
        first = starts + torch.where(ends - starts > skip, skip, 0) if skip else starts
        return hidden[first].float()
    if mode == "lasttoken":
        return hidden[ends - 1].float()
    lengths = ends - starts  # (B,)
    seg = torch.repeat_interleave(  # output_size avoids a device->host sync
        torch.arange(lengths.numel(), device=hidden.device), lengths, output_size=hidden.shape[0]
    )  # (T,)
    positions = torch.arange(hidden.shape[0], device=hidden.device) - starts[seg]  # (T,)
    h = hidden.float()
    keep = (positions >= skip).float()[:, None] if skip else None  # (T, 1)
    if mode == "max":
        if keep is not None:
            h = h.masked_fill(keep == 0, float("-inf"))
        out = torch.full((lengths.numel(), h.shape[1]), float("-inf"), device=h.device)
        return out.scatter_reduce_(0, seg[:, None].expand_as(h), h, reduce="amax")
    weights = (positions + 1).float()[:, None] if mode == "weightedmean" else None  # (T, 1); None: each weighs 1
    if keep is not None:
        weights = keep if weights is None else weights * keep
    summed = torch.zeros(lengths.numel(), h.shape[1], device=h.device)  # (B, H)
    if weights is None:  # no (T, H) product by ones: the sums of the states, the counts are the lengths
        summed.index_add_(0, seg, h)
        total = lengths.float().clamp_min(1e-9)[:, None]  # (B, 1)
    else:
        summed.index_add_(0, seg, h * weights)
        total = torch.zeros(lengths.numel(), 1, device=h.device).index_add_(0, seg, weights).clamp_min(1e-9)  # (B, 1)
    if mode in ("mean", "weightedmean"):
        return summed / total
    if mode == "mean_sqrt_len_tokens":
        return summed / total.sqrt()
    raise ValueError(f"pooling={mode!r}; choose one of sentence-transformers' modes")


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str | tuple[str, ...], skip: int = 0) -> torch.Tensor:
    """hidden (T, H), cu_seqlens (B+1,) -> pooled (B, H * modes) in float32; `skip`: prompt
    tokens at the start of each sequence that do not count (include_prompt=False)."""
    modes = (mode,) if isinstance(mode, str) else mode
    return torch.cat([_pool_one(hidden, cu_seqlens, canonical_pooling(m), skip) for m in modes], dim=1)


def finish(pooled: torch.Tensor, normalize: bool, dim: int | None) -> torch.Tensor:
    """Matryoshka truncation to `dim` first, then L2 normalization (so truncated
    embeddings are unit length again). pooled: (B, H) -> (B, dim or H)."""
    if dim is not None:
        if dim > pooled.shape[1]:
            raise ValueError(f"dim={dim} exceeds the model's embedding size {pooled.shape[1]}")
        pooled = pooled[:, :dim]
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled


def mean_of_windows(embeddings: np.ndarray, starts: np.ndarray, normalize: bool) -> np.ndarray:
    """One embedding per text from its windows' (overlong="chunk"): embeddings (M, D), rows
    grouped by text with each text's first row at `starts` (N,) -> (N, D) means, L2
    renormalized when the model normalizes (a mean of unit vectors is shorter)."""
    counts = np.diff(np.append(starts, len(embeddings)))  # (N,)
    mean = np.add.reduceat(embeddings, starts, axis=0) / counts[:, None]
    if normalize:
        mean /= np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return mean
