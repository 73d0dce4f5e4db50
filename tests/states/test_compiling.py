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
