"""Embedding storage types with sentence-transformers' meanings (torch-free).

`quantize` computes exactly what `sentence_transformers.quantization.quantize_embeddings`
does for each precision (tests compare the bytes), so pooljobs' workers need not import
sentence-transformers. int8/uint8 need per-dimension ranges fixed for the whole job (ranges
computed per batch would give each shard its own scale): `calibration_ranges` reads them
from the `calibration` file, and the provenance records them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from states.errors import ModelLoadError
from states.options import CALIBRATED_DTYPES, OUTPUT_DTYPES


def calibration_ranges(path: str | Path, dim: int) -> np.ndarray:
    """(2, dim) float32 per-dimension [min; max] from a `.npy` file holding either the
    ranges themselves (shape (2, dim)) or calibration embeddings (N, dim), whose
    per-dimension min and max become the ranges (as `quantize_embeddings` takes them)."""
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"calibration={str(path)!r}: cannot read a .npy array: {e}") from e
    if values.ndim != 2 or values.shape[1] != dim or not np.issubdtype(values.dtype, np.floating):
        raise ModelLoadError(f"calibration={str(path)!r} holds a {values.dtype} array of shape {values.shape}; "
                             f"expected float ranges (2, {dim}) or calibration embeddings (N, {dim})")
    if values.shape[0] == 2 and np.all(values[0] <= values[1]):
        return values.astype(np.float32)
    return np.stack([values.min(axis=0), values.max(axis=0)]).astype(np.float32)


def check_output_dtype(output_dtype: str, calibration: str | None) -> None:
    """ValueError naming the choices for an unknown dtype, or an int8/uint8 without ranges."""
    if output_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"output_dtype={output_dtype!r}; choose one of {OUTPUT_DTYPES}")
    if output_dtype in CALIBRATED_DTYPES and calibration is None:
        raise ValueError(f"output_dtype={output_dtype!r} buckets each dimension's range into 256 steps: pass "
                         "calibration=FILE.npy with the (2, dim) ranges or sample embeddings to take them from")


def quantize(values: np.ndarray, output_dtype: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """(N, D) float32 embeddings -> the stored array: float32/float16 as they are; int8 and
    uint8 as 256 buckets of `ranges`; ubinary packed sign bits (N, ceil(D/8)) uint8, binary
    the same minus 128 as int8."""
    if output_dtype == "float32":
        return values.astype(np.float32, copy=False)
    if output_dtype == "float16":
        return values.astype(np.float16)
    if output_dtype in CALIBRATED_DTYPES:
        assert ranges is not None and ranges.shape == (2, values.shape[1]), "int8/uint8 need (2, D) ranges"
        starts = ranges[0].astype(np.float32)
        steps = (ranges[1].astype(np.float32) - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((values - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if output_dtype == "uint8" else (buckets - 128).astype(np.int8)
    if output_dtype == "ubinary":
        return np.packbits(values > 0, axis=-1)
    if output_dtype == "binary":
        return (np.packbits(values > 0, axis=-1) - 128).astype(np.int8)
    raise ValueError(f"output_dtype={output_dtype!r}; choose one of {OUTPUT_DTYPES}")
