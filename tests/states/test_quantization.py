"""Output dtypes mean what sentence-transformers' `quantize_embeddings` means by them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import jobs
from states.errors import ModelLoadError
from states.options import OUTPUT_DTYPES
from states.quantization import calibration_ranges, check_output_dtype, quantize

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def _vectors(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("d", [16, 13])
def test_quantize_equals_quantize_embeddings(precision, d):
    from sentence_transformers.quantization import quantize_embeddings

    values, calibration = _vectors(50, d, 0), _vectors(200, d, 1)
    ranges = calibration_ranges_from(calibration)
    want = quantize_embeddings(values, precision, calibration_embeddings=calibration)
    got = quantize(values, precision, ranges)
    assert got.dtype == want.dtype and np.array_equal(got, want)


def calibration_ranges_from(embeddings: np.ndarray) -> np.ndarray:
    return np.stack([embeddings.min(0), embeddings.max(0)])


def test_float16_is_a_plain_cast():
    values = _vectors(4, 8, 2)
    assert np.array_equal(quantize(values, "float16"), values.astype(np.float16))


def test_names_are_sentence_transformers_precisions():
    from sentence_transformers.quantization import quantize_embeddings

    for name in OUTPUT_DTYPES:
        if name != "float16":  # pooljobs' one addition
            quantize_embeddings(_vectors(3, 8, 0), name, ranges=np.array([[-1.0] * 8, [1.0] * 8]))


def test_calibration_file_holds_ranges_or_embeddings(tmp_path):
    sample = _vectors(30, 8, 3)
    np.save(tmp_path / "sample.npy", sample)
    ranges = calibration_ranges(tmp_path / "sample.npy", 8)
    assert np.array_equal(ranges, calibration_ranges_from(sample))
    np.save(tmp_path / "ranges.npy", ranges)
    assert np.array_equal(calibration_ranges(tmp_path / "ranges.npy", 8), ranges)
    with pytest.raises(ModelLoadError, match=r"shape \(30, 8\); expected float ranges \(2, 16\)"):
        calibration_ranges(tmp_path / "sample.npy", 16)


def test_int8_needs_calibration():
    with pytest.raises(ValueError, match="output_dtype='int8' buckets each dimension's range"):
        check_output_dtype("int8", None)
    with pytest.raises(ValueError, match=r"output_dtype='fp8'; choose one of \('float32'"):
        check_output_dtype("fp8", None)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_job_output_equals_quantize_embeddings(minilm_path, tmp_path, precision):
    """The stored column of a real job equals quantize_embeddings of SentenceTransformer.encode,
    with the calibration ranges recorded in the shards' provenance."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.quantization import quantize_embeddings

    from jobs.samples import sample_texts

    texts, sample = sample_texts(24), sample_texts(80)[40:]
    model = SentenceTransformer(str(minilm_path), device="cpu")
    calibration = model.encode(sample)
    np.save(tmp_path / "calibration.npy", calibration)
    extra = {"calibration": str(tmp_path / "calibration.npy")} if precision.endswith("int8") else {}
    jobs.embed(pd.DataFrame({"text": texts}), model=str(minilm_path), backend="local", device="cpu",
                     progress=False, output_dtype=precision, output=str(tmp_path / "out"), **extra)
    table = pq.read_table(tmp_path / "out")
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    want = quantize_embeddings(model.encode(texts), precision, calibration_embeddings=calibration)
    assert got.dtype == want.dtype
    assert np.mean(got != want) < 0.002  # a value on a bucket or sign boundary may round the other way
    if extra:
        provenance = json.loads(pq.read_schema(next((tmp_path / "out").glob("data/part-*.parquet"))).metadata[b"pooljobs"])
        np.testing.assert_array_equal(np.array(json.loads(provenance["calibration_ranges"]), np.float32),
                                      calibration_ranges_from(calibration))
