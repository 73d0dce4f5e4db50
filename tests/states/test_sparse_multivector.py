"""Sparse (SPLADE) and multivector (ColBERT-style) outputs against sentence-transformers'
`SparseEncoder.encode` and `MultiVectorEncoder.encode_document` on the same tiny saved
models (CPU fp32), on both execution paths, and the Ragged contract's host side; BGE-M3's
three outputs against FlagEmbedding's formulas (`tests.sparse_models.m3_reference`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_reference import random_texts
from states.errors import ModelLoadError
from states.interface import Pack
from states.pipeline import read_pipeline
from states.ragged import Pending, Ragged, flatten, take
from states.runtime import ModelOptions, Runtime
from tests.sparse_models import m3_reference, save_colbert, save_m3, save_splade

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

    path = save_splade(tmp_path / "splade", strategy, activation)
    runtime = Runtime(ModelOptions(model=str(path), device="cpu", execution=execution))
    # chunks of 7 tokens: sequences straddle the MLM head's chunks
    monkeypatch.setattr("states.sparse.LOGITS_PER_CHUNK", 7 * runtime.sparse.vocab)
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


def test_positive_keeps_every_positive_weight_in_column_order():
    """`positive` (the default output's compaction) equals the top-k path at full width, an
    all-zero row and rows of different counts included."""
    from states.sparse import largest, positive

    torch.manual_seed(0)
    weights = torch.relu(torch.randn(6, 50))
    weights[2] = 0
    weights[4, 7:] = 0
    pending = positive(weights)
    assert isinstance(pending, Pending)  # its width is the device's: the caller resolves it when it chooses
    got, want = pending.resolve(), largest(weights, 50)
    assert got["sparse_indices"].lengths.tolist() == (weights > 0).sum(1).tolist()
    for name in ("sparse_indices", "sparse_values"):
        torch.testing.assert_close(got[name].lengths, want[name].lengths)
        for a, b in zip(_rows(got[name]), _rows(want[name])):
            np.testing.assert_array_equal(a, b)
    assert got["sparse_indices"].padded.shape[1] == int((weights > 0).sum(1).max())  # the widest row, no wider


def test_align_vocabulary_pads_the_projection_and_keeps_the_logits():
    """The head's vocabulary projection is padded to aligned rows in place; its first
    `vocab` columns are the logits as saved and the padded ones are zeros."""
    from states.sparse import VOCAB_ALIGN, align_vocabulary

    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1001))
    hidden = torch.randn(5, 16)
    want = head(hidden)
    assert align_vocabulary(head) == 1001 and head[2].out_features % VOCAB_ALIGN == 0
    got = head(hidden)
    torch.testing.assert_close(got[:, :1001], want, rtol=0, atol=1e-6)
    assert not got[:, 1001:].any()


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


# Punctuation, accents, CJK, emoji, a character the tiny vocabulary lacks (<unk>), repeated
# tokens (the sparse max per id), an empty text (<s></s>), and one past max_length (cut).
M3_TEXTS = ["the quick brown fox, jumps!", "Ça coûte 5 € — naïve café; 東京 🙂", "Ω and Ω", "", "a a a a",
            "Engineers debug Ray jobs all day; and all night? https://example.com/a?b=c " * 3, "ok"]
M3_OUTPUTS = "dense,sparse,multivector"


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    return save_m3(tmp_path_factory.mktemp("m3") / "bge-m3")


def _m3_compute(runtime: Runtime, texts: list[str]) -> dict:
    ids = [runtime.tokenizer(t, truncation=True, max_length=runtime.max_length)["input_ids"] for t in texts]
    return runtime.compute(Pack.from_sequences(ids))


def _m3_mismatches(out: dict, want: tuple) -> list[str]:
    """How `out` differs from `m3_reference`'s (dense, lexical, colbert); empty when it agrees."""
    dense, lexical, colbert = want
    problems = []
    if not np.allclose(out["embedding"].numpy(), dense, atol=1e-5):
        problems.append("dense")
    for r, (indices, values, ref) in enumerate(zip(_rows(out["sparse_indices"]), _rows(out["sparse_values"]), lexical)):
        if indices.tolist() != sorted(ref) or not np.allclose(values, [ref[i] for i in sorted(ref)], atol=1e-5):
            problems.append(f"sparse row {r}")
    for r, (got, ref) in enumerate(zip(_rows(out["multivector"]), colbert)):
        if got.shape != ref.shape or not np.allclose(got, ref, atol=1e-5):
            problems.append(f"multivector row {r}: {got.shape} vs {ref.shape}")
    return problems


@pytest.mark.parametrize("execution", ["packed", "padded"])
def test_m3_matches_flag_embedding(m3, execution):
    runtime = Runtime(ModelOptions(model=str(m3), device="cpu", execution=execution, outputs=M3_OUTPUTS))
    assert runtime.ragged == {"sparse_indices", "sparse_values", "multivector"}
    out = _m3_compute(runtime, M3_TEXTS)
    assert _m3_mismatches(out, m3_reference(m3, M3_TEXTS)) == []
    assert not set(np.concatenate(_rows(out["sparse_indices"])).tolist()) & {0, 1, 2, 3}  # <s> <pad> </s> <unk>
    assert out["sparse_indices"].lengths[3] == 0 and out["multivector"].lengths[3] == 1  # "": </s>'s vector alone
    for text in M3_TEXTS[:4]:  # alone: no neighbour in the pack, no padding in the reference
        assert _m3_mismatches(_m3_compute(runtime, [text]), m3_reference(m3, [text])) == [], text


def test_m3_colbert_dim_and_top_k(tmp_path):
    """A ColBERT head narrower than the hidden size (FlagEmbedding's colbert_dim); top-k and
    threshold cut the lexical weights as they cut SPLADE's."""
    path = save_m3(tmp_path / "m3", colbert_dim=16)
    runtime = Runtime(ModelOptions(model=str(path), device="cpu", outputs="multivector,sparse", sparse_top_k=3,
                                   sparse_threshold=0.5))
    assert runtime.output_shapes == {"multivector": (16,), "sparse_indices": (), "sparse_values": ()}
    out = _m3_compute(runtime, M3_TEXTS)
    _, lexical, colbert = m3_reference(path, M3_TEXTS)
    for indices, values, ref in zip(_rows(out["sparse_indices"]), _rows(out["sparse_values"]), lexical):
        best = sorted(sorted((i for i in ref if ref[i] > 0.5), key=lambda i: -ref[i])[:3])
        assert indices.tolist() == best
        np.testing.assert_allclose(values, [ref[i] for i in best], atol=1e-5)
    for got, ref in zip(_rows(out["multivector"]), colbert):
        np.testing.assert_allclose(got, ref, atol=1e-5)
    assert '"top_k": 3' in runtime.provenance()["sparse"]


@pytest.mark.parametrize("mutant", ["cls kept", "colbert head skipped", "special tokens weighed",
                                    "sparse head skipped"])
def test_m3_parity_catches_a_wrong_head(m3, monkeypatch, mutant):
    """The parity check fails when the CLS vector is kept, a head is skipped, or the unused
    tokens keep their weights."""
    from torch import nn

    from states import multivector, sparse

    if mutant == "cls kept":
        monkeypatch.setattr(multivector.ColbertVectors, "drop_first", False)
    elif mutant == "colbert head skipped":
        monkeypatch.setattr(multivector, "load_linear", lambda path, size: nn.Identity())
    elif mutant == "special tokens weighed":
        monkeypatch.setattr(sparse, "unused_token_ids", lambda tokenizer: [])
    else:  # every token weighs 1: the head's weights unused
        monkeypatch.setattr(sparse.LexicalWeights, "forward", lambda self, hidden, pack: sparse.largest(
            torch.ones(pack.num_seqs, pack.max_len), pack.max_len,
            torch.zeros(pack.num_seqs, pack.max_len, dtype=torch.int64) + 4))
    runtime = Runtime(ModelOptions(model=str(m3), device="cpu", outputs=M3_OUTPUTS))
    assert _m3_mismatches(_m3_compute(runtime, M3_TEXTS), m3_reference(m3, M3_TEXTS))


def test_m3_layout_is_detected_from_its_files(m3, splade, tmp_path):
    import shutil

    pipeline = read_pipeline(m3)
    assert (pipeline.m3_sparse.name, pipeline.m3_colbert.name) == ("sparse_linear.pt", "colbert_linear.pt")
    assert pipeline.pooling == ("cls",) and [m.kind for m in pipeline.post] == ["Normalize"]
    assert read_pipeline(splade).m3_sparse is None
    runtime = Runtime(ModelOptions(model=str(m3), device="cpu"))
    assert runtime.outputs == ("dense",)  # auto: what its sentence-transformers modules give
    both = shutil.copytree(splade, tmp_path / "both")  # SpladePooling and an M3 sparse head: which one?
    shutil.copy(m3 / "sparse_linear.pt", both)
    with pytest.raises(ModelLoadError, match="sparse_linear.pt"):
        read_pipeline(both)


def test_m3_no_normalize_leaves_dense_and_colbert_unnormalized(m3):
    """FlagEmbedding's one normalize_embeddings flag covers both; so does normalize=False."""
    runtime = Runtime(ModelOptions(model=str(m3), device="cpu", outputs="dense,multivector", normalize=False))
    out = _m3_compute(runtime, M3_TEXTS)
    dense, _, colbert = m3_reference(m3, M3_TEXTS)
    for got, ref in [(out["embedding"].numpy(), dense), *zip(_rows(out["multivector"]), colbert)]:
        norms = np.linalg.norm(got, axis=-1, keepdims=True)
        assert not np.allclose(norms, 1.0, atol=1e-3)
        np.testing.assert_allclose(got / norms, ref, atol=1e-5)
    assert '"normalize": false' in runtime.provenance()["multivector"]


@pytest.mark.parametrize("content,message", [
    (b"not a torch file", "is not a state dict that torch.load(weights_only=True) reads"),
    ("code", "is not a state dict that torch.load(weights_only=True) reads"),
    ({"weight": torch.zeros(1, 32)}, "an nn.Linear state dict (weight, bias) was expected"),
    ({"weight": torch.zeros(2, 32), "bias": torch.zeros(2)}, "from the model's hidden size 32 to 1"),
])
def test_m3_malformed_head_is_refused(m3, tmp_path, content, message):
    import shutil

    path = shutil.copytree(m3, tmp_path / "m3")
    head = path / "sparse_linear.pt"
    if isinstance(content, bytes):
        head.write_bytes(content)
    else:  # "code": a pickled object whose loading would run code
        torch.save(content if content != "code" else {"weight": ModelLoadError("x")}, head)
    with pytest.raises(ModelLoadError, match="sparse_linear.pt") as e:
        Runtime(ModelOptions(model=str(path), device="cpu", outputs="sparse"))
    assert message in str(e.value)
