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


def test_every_block_of_a_deep_stack_runs_compiled():
    """All blocks share one compiled graph (Inductor on CPU here), with the FFN's linear +
    GELU as one `linear_gelu` call (exact GELU on CPU, so outputs stay equal). Blocks
    compiled with unequal options each took a cache entry of the shared `forward`; past
    Dynamo's limit (8) the rest silently ran eager: 4 of bert-base's 12 layers on the H200."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertConfig, BertModel

    from states.compiling import GeluEpilogue, compile_blocks

    torch._dynamo.reset()
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=10, num_attention_heads=2, intermediate_size=64),
                      add_pooling_layer=False).eval()
    x = torch.randint(0, 100, (1, 9))
    with torch.inference_mode():
        reference = model(x)[0]
        assert compile_blocks(model, {"max_autotune": False}, GeluEpilogue()) == 10  # options, as the benchmarks pass
        with torch._dynamo.config.patch(error_on_recompile=True):  # a block past the first may not compile anew
            out = model(x)[0]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(torch.randint(0, 100, (1, 13)))  # another length: the same dynamic graph
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)
    # Every block ran compiled: one compiled-region call per layer.
    counts = {e.key: e.count for e in prof.key_averages()}
    assert sum(n for key, n in counts.items() if key.startswith("Torch-Compiled Region")) == 10
    assert counts.get("pooljobs::linear_gelu") == 10  # the FFN's linear + GELU, in each block
