"""`states.pooling` against sentence-transformers' `Pooling` module.

Pooling over the packed layout `(T, H)` + `cu_seqlens` must equal sentence-transformers'
over the same sequences right-padded (pads filled with garbage, which a correct mask
ignores), and its own variable-length path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from states.options import POOLING_ALIASES, POOLING_MODES, ST_POOLING_MODES
from states.pooling import check_mode, finish, pool

LENGTHS = [1, 7, 2, 13, 1, 5]
H = 16


def _batch(seed: int, dtype=torch.float32):
    """(packed (T, H), cu_seqlens (B+1,), padded (B, L, H) with garbage pads, mask (B, L))."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, H, generator=g) * 3 for n in LENGTHS]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(LENGTHS), 0)
    padded = torch.randn(len(seqs), max(LENGTHS), H, generator=g) * 100  # pads: large garbage
    mask = torch.zeros(len(seqs), max(LENGTHS), dtype=torch.long)
    for i, s in enumerate(seqs):
        padded[i, : len(s)], mask[i, : len(s)] = s, 1
    return torch.cat(seqs).to(dtype), cu, padded.to(dtype), mask


def _sentence_transformers(mode, features: dict, include_prompt: bool = True) -> torch.Tensor:
    from sentence_transformers.sentence_transformer.modules import Pooling

    module = Pooling(H, pooling_mode=mode, include_prompt=include_prompt)
    return module(dict(features))["sentence_embedding"].float()


def test_modes_are_sentence_transformers_names():
    from sentence_transformers.sentence_transformer.modules import Pooling

    assert set(ST_POOLING_MODES) == set(Pooling.POOLING_MODES)
    assert set(POOLING_MODES) == set(ST_POOLING_MODES) | set(POOLING_ALIASES)
    assert set(POOLING_ALIASES.values()) <= set(ST_POOLING_MODES)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mode", ST_POOLING_MODES)
def test_pool_matches_sentence_transformers_padded(mode, seed):
    packed, cu, padded, mask = _batch(seed)
    want = _sentence_transformers(mode, {"token_embeddings": padded, "attention_mask": mask})
    got = pool(packed, cu, mode)
    assert got.shape == (len(LENGTHS), H) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ST_POOLING_MODES)
def test_pool_matches_sentence_transformers_varlen(mode):
    packed, cu, _, _ = _batch(2)
    want = _sentence_transformers(mode, {"token_embeddings": packed[None], "cu_seq_lens_q": cu})
    torch.testing.assert_close(pool(packed, cu, mode), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("alias", sorted(POOLING_ALIASES))
def test_aliases_pool_as_their_mode(alias):
    packed, cu, _, _ = _batch(4)
    torch.testing.assert_close(pool(packed, cu, alias), pool(packed, cu, POOLING_ALIASES[alias]))


@pytest.mark.parametrize("modes", [("cls", "mean"), ("max", "weightedmean", "lasttoken")])
def test_several_modes_concatenate_in_order(modes):
    packed, cu, padded, mask = _batch(5)
    want = _sentence_transformers(modes, {"token_embeddings": padded, "attention_mask": mask})
    got = pool(packed, cu, modes)
    assert got.shape == (len(LENGTHS), H * len(modes))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ST_POOLING_MODES)
def test_prompt_left_out_as_sentence_transformers(mode):
    """include_prompt=False: the first `prompt_length` tokens do not count (padded and
    variable-length sentence-transformers paths agree with ours)."""
    packed, cu, padded, mask = _batch(6)
    skip = 1
    # A sequence that is all prompt has no pooled value (sentence-transformers' two paths disagree on it).
    longer = torch.tensor(LENGTHS) > skip
    for features in ({"token_embeddings": padded, "attention_mask": mask},
                     {"token_embeddings": packed[None], "cu_seq_lens_q": cu}):
        want = _sentence_transformers(mode, {**features, "prompt_length": skip}, include_prompt=False)
        got = pool(packed, cu, mode, skip=skip)
        torch.testing.assert_close(got[longer], want[longer], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ST_POOLING_MODES)
def test_pool_bf16_accumulates_in_fp32(mode):
    packed, cu, _, _ = _batch(3)
    half = packed.to(torch.bfloat16)
    got = pool(half, cu, mode)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, pool(half.float(), cu, mode))


def test_pool_single_sequence_of_one_token():
    h = torch.randn(1, H)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    for mode in POOLING_MODES:
        torch.testing.assert_close(pool(h, cu, mode), h)


def test_check_mode_lists_choices():
    assert check_mode("weighted_mean") == "weightedmean" and check_mode("lasttoken") == "lasttoken"
    with pytest.raises(ValueError, match=r"pooling='last_token' is not a pooling mode; choose one of \('cls', 'mean'"):
        check_mode("last_token")


# -- finish: Matryoshka truncation, then normalization ---------------------------------
def test_finish_truncates_then_renormalizes():
    pooled = torch.randn(4, H) * 5
    got = finish(pooled, normalize=True, dim=6)
    assert got.shape == (4, 6)
    torch.testing.assert_close(got.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(got, pooled[:, :6] / pooled[:, :6].norm(dim=1, keepdim=True))
    # normalizing first and truncating after would not give unit vectors
    assert not torch.allclose(F.normalize(pooled, dim=1)[:, :6].norm(dim=1), torch.ones(4))


def test_finish_without_normalize_only_truncates():
    pooled = torch.randn(3, H)
    torch.testing.assert_close(finish(pooled, normalize=False, dim=5), pooled[:, :5])
    assert finish(pooled, normalize=False, dim=None) is pooled
    torch.testing.assert_close(finish(pooled, normalize=True, dim=H), F.normalize(pooled, dim=1))


def test_finish_dim_larger_than_embedding_errors():
    with pytest.raises(ValueError, match=f"dim={H + 1} exceeds the model's embedding size {H}"):
        finish(torch.randn(2, H), normalize=True, dim=H + 1)
