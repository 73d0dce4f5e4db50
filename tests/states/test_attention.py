"""Grouped-query attention reaches FlashAttention with its kv heads as they are.

FlashAttention runs only on CUDA (tests/gpu checks its numbers there); on meta tensors
the same calls run their shape functions, so CI can see which ops `_flash` issues."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from states import attention


class _Ops(TorchDispatchMode):
    """Records each op's name and the head counts of its (T, H, D) tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), [a.shape[1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 3]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("api", ["varlen_attn enable_gqa", "aten op (torch <= 2.11)"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (15, 0)], ids=["bidir", "causal", "sliding-causal"])
def test_gqa_calls_flash_attention_once_with_the_kv_heads_as_they_are(monkeypatch, api, window):
    if api.startswith("varlen_attn") and "enable_gqa" not in attention._VARLEN_PARAMS:
        pytest.skip("this torch's varlen_attn has no enable_gqa")
    if api.startswith("aten"):
        monkeypatch.setattr(attention, "_VARLEN_PARAMS", attention._VARLEN_PARAMS - {"enable_gqa"})
    q = torch.empty(10, 8, 64, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(10, 2, 64, device="meta", dtype=torch.bfloat16)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32, device="meta")
    with _Ops() as ops:
        out = attention._flash(q, kv, kv, cu, 7, None, window)
    assert out.shape == q.shape
    (name, heads), = ops.calls  # one op: no copies of the kv heads before it
    assert name in ("torch_attn._varlen_attn.default", "aten._flash_attention_forward.default") and heads == [8, 2, 2]
