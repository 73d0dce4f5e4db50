"""`torch.compile` of a model's repeated blocks ("regional compilation").

Eager transformer layers spend a third of an H200's time in unfused element-wise
kernels (bias + GELU, residual + LayerNorm, RMSNorm, rotary); compiling fuses them.
Compiling each block of the layer stack, not the whole model, traces one block once and
reuses the code for every layer (minutes less start-up on deep decoders), and with
`dynamic=True` one graph serves every pack size, so packs need no fixed shapes.

One thing Inductor does worse than eager: its dynamic-shape GELU kernel took 1.28 ms on
a 208k x 3072 bf16 activation on an H200, aten's 0.81 (`python -m bench.gelu`); in a
bert-base run it was 356 ms of 1.86 s of kernels, aten's 207 ms (`python -m
bench.timeline`). A GELU that only feeds matmuls has nothing to fuse with, so the blocks
call aten's there (`GeluBeforeMatmul`). Every block gets the same options object: a
fresh pass per block made each a different backend for the one shared `forward`, and
past Dynamo's limit of 8 entries the other blocks silently ran eager (4 of bert-base's 12).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._inductor.custom_graph_pass import CustomGraphPass


@torch.library.custom_op("pooljobs::gelu", mutates_args=())
def aten_gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """aten's GELU kernel, opaque to Inductor."""
    return F.gelu(x, approximate=approximate)


@aten_gelu.register_fake
def _(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.empty_like(x)


class GeluBeforeMatmul(CustomGraphPass):
    """Inductor pre-grad pass: a GELU whose every user is a `linear` runs as `aten_gelu`
    (fused forms, such as GeGLU's `gelu(a) * b`, stay with Inductor)."""

    def __call__(self, graph: fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not F.gelu or not node.users:
                continue
            if any(user.op != "call_function" or user.target is not F.linear for user in node.users):
                continue
            approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
            with graph.inserting_after(node):
                eager = graph.call_function(torch.ops.pooljobs.gelu.default, (node.args[0],), {"approximate": approximate})
            node.replace_all_uses_with(eager)
            graph.erase_node(node)

    def uuid(self) -> str:  # keys Inductor's graph cache
        return "pooljobs.GeluBeforeMatmul.1"


INDUCTOR_OPTIONS = {"pre_grad_custom_pass": GeluBeforeMatmul()}


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


def compile_blocks(model: nn.Module, options: dict | None = None) -> int:
    """Compile each repeated block in place (on first call), with these Inductor
    `options` over `INDUCTOR_OPTIONS` (benchmarks compare some); returns how many."""
    blocks = repeated_blocks(model)
    shared = INDUCTOR_OPTIONS if options is None else {**INDUCTOR_OPTIONS, **options}  # one object for all blocks
    for block in blocks:
        block.compile(dynamic=True, options=shared)
    return len(blocks)
