"""bf16 sparse and multivector jobs on CUDA against sentence-transformers in float32 on the
same GPU (`SparseEncoder.encode`, `MultiVectorEncoder.encode_document`): cos >= 0.999 per
row over the dense vocabulary weights, and per kept token, with the same tokens kept; a
BGE-M3's three outputs from one bf16 job against FlagEmbedding's formulas in float32."""

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
    dense, lexical, colbert = m3_reference(path, texts)  # float32, CPU
    dense_cos = _cos(np.stack(out["embedding"]).astype(np.float32), dense)
    vocab = 1 + max([*(max(row, default=0) for row in lexical), *(max(i, default=0) for i in out["sparse_indices"])])
    got, want = np.zeros((len(texts), vocab), np.float32), np.zeros((len(texts), vocab), np.float32)
    for r, (indices, values, ref) in enumerate(zip(out["sparse_indices"], out["sparse_values"], lexical)):
        got[r, np.asarray(indices)] = values
        want[r, list(ref)] = list(ref.values())
    sparse_cos = _cos(got, want)
    multi_cos = []
    for vectors, ref in zip(out["multivector"], colbert):
        vectors = np.stack(vectors).astype(np.float32)
        assert vectors.shape == ref.shape  # tokens - 1 vectors: the CLS left out
        multi_cos.append(_cos(vectors, ref).min())
    print(f"bge-m3 bf16 vs FlagEmbedding formulas fp32: min cos dense {dense_cos.min():.6f}, "
          f"sparse {sparse_cos.min():.6f}, multivector {min(multi_cos):.6f}")
    assert min(dense_cos.min(), sparse_cos.min(), min(multi_cos)) >= BF16_MIN_COS
