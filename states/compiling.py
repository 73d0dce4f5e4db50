"""`torch.compile` of a model's repeated blocks ("regional compilation").

Eager transformer layers spend a third of an H200's time in unfused element-wise
kernels (bias + GELU, residual + LayerNorm, RMSNorm, rotary); compiling fuses them.
Compiling each block of the layer stack, not the whole model, traces one block once and
reuses the code for every layer (minutes less start-up on deep decoders), and with
`dynamic=True` one graph serves every pack size, so packs need no fixed shapes.

Inductor's one weak spot there is the FFN's GELU: with dynamic shapes its kernel reads and
writes the (tokens x 4·hidden) activation at 1.6x eager's time, 14% of a bert-base
forward. `GeluEpilogue` moves bias + GELU into the matmul itself (cuBLASLt's epilogue),
so that activation is written once and never read back for the GELU.

Compiled code persists across processes: before the first compile, Inductor's cache
(its FX graph cache and the Triton kernels under it) is pointed at a folder under
`~/.cache/pooljobs/inductor`, one per torch version and GPU model, so a later run of the
same model finds its kernels instead of generating and building them again. A
`TORCHINDUCTOR_CACHE_DIR` the user set wins; `POOLJOBS_CACHE` moves the root.

Every block gets the same options object: blocks compiled with unequal options (a fresh
graph-pass object each, in an earlier version) each took a cache entry of the one shared
`forward`, and past Dynamo's limit of 8 the others silently ran eager (4 of bert-base's
12 layers on the H200).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._inductor.custom_graph_pass import CustomGraphPass

from states.files import cache_root


@torch.library.custom_op("pooljobs::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`gelu(linear(x, weight, bias))` as one matmul with a bias + GELU epilogue; opaque to
    Inductor, which would split it again. On CUDA cuBLASLt computes GELU's tanh form (at
    most 4.7e-4 from the exact one: far below bf16's step of 0.0156 at GELU's inputs
    near 2.7, where they differ most); on CPU the exact form."""
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return out.view(*x.shape[:-1], weight.shape[0])


@linear_gelu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class GeluEpilogue(CustomGraphPass):
    """Inductor pre-grad pass: `gelu(linear(x, w, b))`, where the GELU is the linear's only
    user and the linear has a bias, becomes `linear_gelu` (GeGLU's `gelu(a) * b` too).
    Inductor's caches key graphs by `uuid` and skip the pass on a hit, so it keeps no state."""

    def __call__(self, graph: fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not F.gelu or len(node.args) != 1:
                continue
            linear = node.args[0]
            if not isinstance(linear, fx.Node) or linear.target is not F.linear or len(linear.users) != 1:
                continue
            x, weight, bias = (*linear.args, linear.kwargs.get("bias"))[:3]
            if bias is None:
                continue
            with graph.inserting_after(node):
                fused = graph.call_function(torch.ops.pooljobs.linear_gelu.default, (x, weight, bias))
            node.replace_all_uses_with(fused)
            graph.erase_node(node)
            graph.erase_node(linear)

    def uuid(self) -> str:  # keys Inductor's graph cache
        return "pooljobs.GeluEpilogue.1"


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's layer stacks: members of every `nn.ModuleList` whose
    (two or more) members share one class; found by structure, so wrappers (PEFT,
    user modules) do not hide them."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()  # ids of modules within blocks already taken (nested lists are not stacks)
    for module in model.modules():
        if id(module) in inside:
            continue
        if isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            blocks.extend(module)
            inside.update(id(m) for m in module.modules())
    return blocks


def cache_dir(device: torch.device) -> Path:
    """Where compiled artifacts for `device` persist: keyed by torch version and GPU model
    (kernels built for one GPU or torch do not serve another)."""
    root = cache_root()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return root / "inductor" / re.sub(r"[^A-Za-z0-9.+-]+", "_", f"torch-{torch.__version__}-{where}")


def persist_caches(device: torch.device) -> Path:
    """Point Inductor's cache at `cache_dir(device)` unless the user chose one; returns
    the folder in use. Read by Inductor at each compile, so this must run before it."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen:
        return Path(chosen)
    folder = cache_dir(device)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return folder


def compile_blocks(model: nn.Module, options: dict | None = None, gelu: GeluEpilogue | None = None) -> int:
    """Compile each repeated block in place (on first call), all with one Inductor options
    object: `options` (benchmarks compare some), plus the `gelu` pass when given (None:
    GELU stays exact), with Inductor's caches kept across processes; returns how many."""
    blocks = repeated_blocks(model)
    if blocks:
        persist_caches(next(model.parameters()).device)
    shared = {**({"pre_grad_custom_pass": gelu} if gelu is not None else {}), **(options or {})}
    for block in blocks:
        block.compile(dynamic=True, options=shared)
    return len(blocks)
