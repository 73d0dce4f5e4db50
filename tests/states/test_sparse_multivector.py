"""Sparse (SPLADE) and multivector (ColBERT-style) outputs against sentence-transformers'
`SparseEncoder.encode` and `MultiVectorEncoder.encode_document` on the same tiny saved
models (CPU fp32), on both execution paths, and the Ragged contract's host side."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_reference import random_texts
from states.interface import Pack
from states.pipeline import read_pipeline
from states.ragged import Ragged, flatten, take
from states.runtime import ModelOptions, Runtime
from tests.sparse_models import save_colbert, save_splade

TEXTS = ["the quick brown fox, jumps!", "ok", "Engineers DEBUG Ray jobs all day... and all night?", "!"] + \
    random_texts(8, seed=5)


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    return save_splade(tmp_path_factory.mktemp("sparse") / "splade")


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    return save_colbert(tmp_path_factory.mktemp("mv") / "colbert", normalize=True)


def _rows(out: Ragged) -> list[np.ndarray]:
    values, lengths = flatten([out])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _compute(runtime: Runtime, texts: list[str]) -> dict:
    return runtime.compute(Pack.from_sequences([runtime.tokenizer(t)["input_ids"] for t in texts]))


@pytest.mark.parametrize("execution", ["packed", "padded"])
@pytest.mark.parametrize("strategy,activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_sparse_matches_sparse_encoder(tmp_path, monkeypatch, execution, strategy, activation):
    from sentence_transformers import SparseEncoder

    monkeypatch.setattr("states.sparse.CHUNK_TOKENS", 7)  # sequences straddle the MLM head's token chunks
    path = save_splade(tmp_path / "splade", strategy, activation)
    runtime = Runtime(ModelOptions(model=str(path), device="cpu", execution=execution))
    assert runtime.outputs == ("sparse",) and runtime.ragged == {"sparse_indices", "sparse_values"}
    out = _compute(runtime, TEXTS)
    want = SparseEncoder(str(path), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    for indices, values, ref in zip(_rows(out["sparse_indices"]), _rows(out["sparse_values"]), want):
        np.testing.assert_array_equal(indices, np.nonzero(ref)[0])  # every nonzero, by ascending index
        np.testing.assert_allclose(values, ref[indices], rtol=1e-5, atol=1e-5)


def test_sparse_top_k_and_threshold(splade):
    from sentence_transformers import SparseEncoder

    runtime = Runtime(ModelOptions(model=str(splade), device="cpu", sparse_top_k=10, sparse_threshold=0.05))
    out = _compute(runtime, TEXTS)
    want = SparseEncoder(str(splade), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    for indices, values, ref in zip(_rows(out["sparse_indices"]), _rows(out["sparse_values"]), want):
        best = np.argsort(-ref, kind="stable")[:10]
        expected = np.sort(best[ref[best] > 0.05])
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_allclose(values, ref[expected], rtol=1e-5, atol=1e-5)
    assert '"top_k": 10' in runtime.provenance()["sparse"]


def test_dense_and_sparse_from_one_forward(splade):
    both = Runtime(ModelOptions(model=str(splade), device="cpu", outputs="dense,sparse", pooling="mean"))
    sparse = Runtime(ModelOptions(model=str(splade), device="cpu"))
    out, alone = _compute(both, TEXTS), _compute(sparse, TEXTS)
    assert out["embedding"].shape == (len(TEXTS), 32)
    for a, b in zip(_rows(out["sparse_values"]), _rows(alone["sparse_values"])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("execution", ["packed", "padded"])
def test_multivector_matches_multi_vector_encoder(colbert, execution):
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

    runtime = Runtime(ModelOptions(model=str(colbert), device="cpu", execution=execution))
    assert runtime.outputs == ("multivector",) and runtime.output_shapes == {"multivector": (16,)}
    got = _rows(_compute(runtime, TEXTS)["multivector"])
    want = MultiVectorEncoder(str(colbert), device="cpu").encode_document(TEXTS)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape  # punctuation left out, special tokens kept
        np.testing.assert_allclose(g, w, atol=1e-5)
    assert got[3].shape[0] == 2  # "!" is [CLS] ! [SEP]: the skiplist drops the "!"


def test_pipeline_layouts(splade, colbert):
    sparse = read_pipeline(splade)
    assert sparse.transformer_task == "fill-mask" and sparse.splade.config["pooling_strategy"] == "max"
    multi = read_pipeline(colbert)
    assert [m.kind for m in multi.token_post] == ["Dense", "Normalize"] and multi.multivector_mask is not None
    assert multi.pooling is None and not multi.post


def test_ragged_take_reorders_rows():
    values = np.arange(6, dtype=np.float32)[:, None]
    lengths = np.array([1, 3, 0, 2])
    got, got_lengths = take(values, lengths, np.array([3, 2, 0, 1]))
    np.testing.assert_array_equal(got_lengths, [2, 0, 1, 3])
    np.testing.assert_array_equal(got[:, 0], [4, 5, 0, 1, 2, 3])
    padded = Ragged(torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), torch.tensor([2, 1]))
    flat, n = flatten([padded, Ragged.empty(())])
    np.testing.assert_array_equal(flat, [1, 2, 3])
    np.testing.assert_array_equal(n, [2, 1])
