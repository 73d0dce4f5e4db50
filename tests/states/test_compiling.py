"""Regional compilation finds the layer blocks by structure, through wrappers too."""

from __future__ import annotations

import pytest
from torch import nn

from states.compiling import repeated_blocks
from states.loading import load_model


@pytest.mark.parametrize("arch,blocks", [("bert", "BertLayer"), ("qwen3", "Qwen3DecoderLayer"), ("t5", "T5Block")])
def test_blocks_are_the_layer_stack(tiny_model, arch, blocks):
    import torch

    model = load_model(tiny_model(arch), "embed", torch.float32, torch.device("cpu"))
    found = repeated_blocks(model)
    stacks = 2 if arch == "t5" else 1  # T5: encoder and decoder stacks
    assert len(found) == 2 * stacks and {type(b).__name__ for b in found} == {blocks}


def test_nested_lists_and_mixed_lists_are_not_blocks():
    inner = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    outer = nn.ModuleList([nn.Sequential(nn.Linear(2, 2), inner), nn.Sequential(nn.Linear(2, 2), nn.ReLU())])
    mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
    model = nn.Sequential(outer, mixed)
    assert repeated_blocks(model) == list(outer)
    assert repeated_blocks(nn.Linear(2, 2)) == []


class _Mlp(nn.Module):
    """A GELU into a matmul (BERT's FFN), and one fused into a product (GeGLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.gate = nn.Linear(4, 16), nn.Linear(16, 4), nn.Linear(4, 16)

    def forward(self, x):
        import torch.nn.functional as F

        return self.down(F.gelu(self.up(x))) + self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))


def _through_dynamo(module: nn.Module, *args):
    """(result, graphs) of `module` traced by Dynamo (the graph Inductor's pre-grad
    passes see), with `GeluBeforeMatmul` applied and run as is, no Inductor."""
    import torch

    from states.compiling import GeluBeforeMatmul

    graphs = []

    def backend(gm, example_inputs):
        GeluBeforeMatmul()(gm.graph)
        gm.recompile()
        graphs.append(gm.graph)
        return gm.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        return torch.compile(module, backend=backend, dynamic=True)(*args), graphs


def _targets(graphs) -> list:
    return [n.target for g in graphs for n in g.nodes if n.op == "call_function"]


def test_gelu_before_matmul_runs_as_aten_and_only_there():
    import torch
    import torch.nn.functional as F

    module = _Mlp()
    x = torch.randn(3, 4)
    out, graphs = _through_dynamo(module, x)
    targets = _targets(graphs)
    assert targets.count(torch.ops.pooljobs.gelu.default) == 1 and targets.count(F.gelu) == 1  # GeGLU's stays
    with torch.inference_mode():
        torch.testing.assert_close(out, module(x), rtol=0, atol=0)


def test_bert_blocks_get_aten_gelu(tiny_model):
    import torch

    model = load_model(tiny_model("bert"), "embed", torch.float32, torch.device("cpu"))
    block = repeated_blocks(model)[0]
    hidden = torch.randn(1, 6, model.config.hidden_size)
    out, graphs = _through_dynamo(block, hidden)
    assert _targets(graphs).count(torch.ops.pooljobs.gelu.default) == 1
    first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731 (layers return a tuple in some versions)
    with torch.inference_mode():
        torch.testing.assert_close(first(out), first(block(hidden)))


def test_every_block_of_a_deep_stack_runs_compiled():
    """All blocks share one compiled graph (Inductor on CPU here). Blocks compiled with
    differing options each took a cache entry of the shared `forward`; past Dynamo's
    limit (8) the rest silently ran eager: 4 of bert-base's 12 layers on the H200."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertConfig, BertModel

    from states.compiling import compile_blocks

    torch._dynamo.reset()
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=10, num_attention_heads=2, intermediate_size=64),
                      add_pooling_layer=False).eval()
    x = torch.randint(0, 100, (1, 9))
    with torch.inference_mode():
        reference = model(x)[0]
        assert compile_blocks(model) == 10
        with torch._dynamo.config.patch(error_on_recompile=True):  # a block past the first may not compile anew
            out = model(x)[0]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(torch.randint(0, 100, (1, 13)))  # another length: the same dynamic graph
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)
    # Every block ran compiled, with the GELU pass: an eager block would call F.gelu instead.
    assert sum(e.count for e in prof.key_averages() if e.key == "pooljobs::gelu") == 10
