"""Variable-length (packed) attention for transformers models, registered by name.

A pack holds many sequences back to back in one `(1, T)` row; `cu_seq_lens_q`
(`(B+1,)` int32 offsets) tells where each starts. Transformers 5 forwards unknown
keyword arguments from the model's `forward` down to the attention function, so a
function registered under `ATTN_NAME` sees them and attends within each sequence only.

On CUDA the work goes to `torch.nn.attention.varlen.varlen_attn` (FlashAttention);
elsewhere, to an exactly equivalent loop of per-sequence SDPA calls, so CPU CI runs the
same packing, positions and pooling as the GPU.

Grouped-query attention (fewer kv heads than query heads) goes to the kernel as it is:
FlashAttention reads each kv head for its group of query heads. Repeating the kv heads
first cost 38% of Qwen3-0.6B's attention time on the H200, and its copies (fused by
Inductor with RoPE and the q/k norms) another 22% of the forward.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTN_NAME = "pooljobs_varlen"

try:  # torch >= 2.10; 2.10 takes `is_causal`, later releases `window_size`
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _VARLEN_PARAMS = set(inspect.signature(_varlen_attn).parameters)
except ImportError:  # pragma: no cover - older torch
    _varlen_attn = None
    _VARLEN_PARAMS = set()


def _window(is_causal: bool, sliding_window: int | None) -> tuple[int, int]:
    """(left, right) window in flash-attention convention; -1 means unbounded.

    Transformers passes `sliding_window` as the module's own value, which (as in its
    flash-attention integration) allows distances up to `sliding_window - 1`.
    """
    w = -1 if sliding_window is None else sliding_window - 1
    return (w, 0) if is_causal else (w, w)


def _varlen_kwargs(window: tuple[int, int]) -> dict | None:
    """How to ask this torch's varlen_attn for `window`, or None when it cannot."""
    if _varlen_attn is None:
        return None
    if "window_size" in _VARLEN_PARAMS:
        return {"window_size": window}
    if "is_causal" in _VARLEN_PARAMS and window in ((-1, -1), (-1, 0)):
        return {"is_causal": window == (-1, 0)}
    return None


def _segment_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], scale: float | None, window: tuple[int, int]
) -> torch.Tensor:
    """Exact reference: SDPA on each sequence alone. q/k/v: (H, T, D) -> (H, T, D)."""
    out = torch.empty_like(q)
    for start, end in zip(cu[:-1], cu[1:]):
        n = end - start
        mask = None
        if window != (-1, -1):
            i = torch.arange(n, device=q.device)
            d = i[:, None] - i[None, :]  # query - key
            left, right = window
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device)
            if left >= 0:
                mask &= d <= left
            if right >= 0:
                mask &= -d <= right
        out[:, start:end] = F.scaled_dot_product_attention(
            q[:, start:end], k[:, start:end], v[:, start:end], attn_mask=mask, scale=scale
        )
    return out


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float | None,
    window: tuple[int, int],
) -> torch.Tensor | None:
    """FlashAttention over packed q (T, H, D) and k/v (T, H_kv, D), H_kv dividing H; None
    when this torch cannot run `window`."""
    gqa = k.shape[1] != q.shape[1]
    if gqa and "enable_gqa" not in _VARLEN_PARAMS:
        # torch <= 2.11's varlen_attn refuses fewer kv heads, though the FlashAttention op
        # it wraps (the same call, window included) takes them.
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, window == (-1, 0), False,
            scale=scale, window_size_left=window[0], window_size_right=window[1],
        )[0]
    extra = _varlen_kwargs(window)
    if extra is None:
        return None
    return _varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **extra, **({"enable_gqa": True} if gqa else {}))


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over packed sequences. query/key/value: (1, H, T, D) -> output (1, T, H, D)."""
    if cu_seq_lens_q is None:
        raise RuntimeError(
            f"{ATTN_NAME} attention needs cu_seq_lens_q; the model was called without a pack "
            "(run it through a pooljobs ModelState, or switch to execution='padded')"
        )
    assert query.shape[0] == 1, f"packed attention expects batch 1, got {tuple(query.shape)}"
    is_causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False)))
    window = _window(is_causal, sliding_window)
    # FlashAttention takes fp16/bf16 only; fp32 (reference runs) takes the exact loop.
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        max_len = int(max_length_q) if max_length_q is not None else int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
        out = _flash(*(t[0].transpose(0, 1) for t in (query, key, value)), cu_seq_lens_q, max_len, scaling, window)
        if out is not None:
            return out.unsqueeze(0), None
    groups = query.shape[1] // key.shape[1]
    q, k, v = query[0], key[0].repeat_interleave(groups, dim=0), value[0].repeat_interleave(groups, dim=0)  # (H, T, D)
    out = _segment_attention(q, k, v, cu_seq_lens_q.tolist(), scaling, window)
    return out.transpose(0, 1).unsqueeze(0), None


def _no_mask(*args, **kwargs) -> None:
    """Packed attention needs no dense mask: sequence boundaries come from cu_seq_lens."""
    return None


AttentionInterface.register(ATTN_NAME, varlen_attention_forward)
AttentionMaskInterface.register(ATTN_NAME, _no_mask)
