"""bf16 sparse and multivector jobs on CUDA against sentence-transformers in float32 on the
same GPU (`SparseEncoder.encode`, `MultiVectorEncoder.encode_document`): cos >= 0.999 per
row over the dense vocabulary weights, and per kept token, with the same tokens kept; a
BGE-M3's three outputs from one bf16 job against FlagEmbedding's formulas in float32, each
within 0.999 or, where bf16 itself strays further on the tiny test model, within twice the
error of the same formulas run in bf16 on a plain padded transformers forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.sparse_models import m3_reference, save_colbert, save_m3, save_splade

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BF16_MIN_COS = 0.999


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from jobs.samples import sample_texts

    return sample_texts(64)


def test_bf16_sparse_matches_sparse_encoder(tmp_path, texts):
    import jobs
    from sentence_transformers import SparseEncoder

    path = save_splade(tmp_path / "splade")
    out = jobs.embed(pd.DataFrame({"text": texts}), model=str(path), backend="local", device="cuda")
    want = SparseEncoder(str(path), device="cuda").encode(texts, convert_to_tensor=True).to_dense().float().cpu().numpy()
    got = np.zeros_like(want)
    for r, (indices, values) in enumerate(zip(out["sparse_indices"], out["sparse_values"])):
        got[r, np.asarray(indices)] = values
    cos = _cos(got, want)
    print(f"sparse bf16 vs SparseEncoder fp32: min cos {cos.min():.6f}")
    assert cos.min() >= BF16_MIN_COS


def test_bf16_multivector_matches_multi_vector_encoder(tmp_path, texts):
    import jobs
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

    path = save_colbert(tmp_path / "colbert", normalize=True)
    out = jobs.embed(pd.DataFrame({"text": texts}), model=str(path), backend="local", device="cuda")
    want = MultiVectorEncoder(str(path), device="cuda").encode_document(texts)
    cos = []
    for got, ref in zip(out["multivector"], want):
        got, ref = np.stack(got).astype(np.float32), np.asarray(ref.float().cpu() if torch.is_tensor(ref) else ref)
        assert got.shape == ref.shape
        cos.append(_cos(got, ref).min())
    print(f"multivector bf16 vs MultiVectorEncoder fp32: min cos {min(cos):.6f}")
    assert min(cos) >= BF16_MIN_COS


def test_bf16_m3_matches_flag_embedding(tmp_path, texts):
    import jobs

    path = save_m3(tmp_path / "m3")
    out = jobs.embed(pd.DataFrame({"text": texts}), model=str(path), backend="local", device="cuda",
                     outputs="dense,sparse,multivector")
    want = m3_reference(path, texts)  # float32, CPU
    floor = m3_reference(path, texts, dtype="bfloat16", device="cuda")  # bf16's own error on this model
    got = (np.stack(out["embedding"]).astype(np.float32),
           [dict(zip(i, v)) for i, v in zip(out["sparse_indices"], out["sparse_values"])],
           [np.stack(v).astype(np.float32) for v in out["multivector"]])
    ours, plain = _m3_min_cos(got, want), _m3_min_cos(floor, want)
    print("bge-m3 bf16 vs FlagEmbedding formulas fp32, min cos (pooljobs / plain transformers bf16): "
          + ", ".join(f"{k} {ours[k]:.6f} / {plain[k]:.6f}" for k in ours))
    for k in ours:
        assert 1 - ours[k] <= max(1 - BF16_MIN_COS, 2 * (1 - plain[k])), k


def _m3_min_cos(got: tuple, want: tuple) -> dict[str, float]:
    """Per output, the least cosine of `got` (dense, lexical weights, colbert) to `want`'s:
    per row for dense and for the lexical weights over the vocabulary, per token for colbert."""
    (dense, lexical, colbert), (dense_ref, lexical_ref, colbert_ref) = got, want
    vocab = 1 + max(max(row, default=0) for row in [*lexical, *lexical_ref])
    sparse, sparse_ref = np.zeros((len(dense), vocab), np.float32), np.zeros((len(dense), vocab), np.float32)
    for r, (row, ref) in enumerate(zip(lexical, lexical_ref)):
        sparse[r, list(row)], sparse_ref[r, list(ref)] = list(row.values()), list(ref.values())
    multi = []
    for vectors, ref in zip(colbert, colbert_ref):
        assert vectors.shape == ref.shape  # tokens - 1 vectors: the CLS left out
        multi.append(_cos(vectors, ref).min())
    return {"dense": float(_cos(dense, dense_ref).min()), "sparse": float(_cos(sparse, sparse_ref).min()),
            "multivector": float(min(multi))}
