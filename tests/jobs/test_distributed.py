"""Distributed runs write exactly the single-process output; the driver stays bounded.

Every Ray run is compared shard by shard with the `backend="local"` reference: same
shard names, same ids in the same order, embeddings within 1e-6, every id once.
"""

from __future__ import annotations

import gc
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import ray

from jobs import driver
from jobs.driver import run_job

MiB = 1 << 20


def test_gpu_actors_match_single_process(ray_local, make_spec, same_as_reference, tmp_path):
    """Two fake GPUs: the driver starts one actor per GPU (each runs on CPU here)."""
    outcome = run_job(make_spec(tmp_path, backend="ray"))
    assert outcome.ok, outcome.failed
    assert len({w["pid"] for w in outcome.report["workers"]}) == 2
    same_as_reference(tmp_path)


# -- backpressure ---------------------------------------------------------------------------
ROWS_PER_UNIT, PAYLOAD_BYTES = 20, 256 * 1024


def write_wide_corpus(path: Path, units: int) -> Path:
    """One file of `units` row groups of 20 short texts; every row also carries 256 KiB
    the job never reads, so the corpus is large in memory (5 MiB a unit) yet cheap to
    embed and small on disk."""
    payload = pa.array([b"\x01" * PAYLOAD_BYTES] * ROWS_PER_UNIT, pa.binary())
    schema = pa.schema([("id", pa.int64()), ("text", pa.string()), ("payload", pa.binary())])
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, schema) as writer:
        for u in range(units):
            ids = range(u * ROWS_PER_UNIT, (u + 1) * ROWS_PER_UNIT)
            writer.write_table(pa.table([pa.array(ids, pa.int64()), pa.array([f"row {i} of unit {u}" for i in ids]),
                                         payload], schema=schema))
    return path


def peak_rss_growth(fn) -> tuple[int, object]:
    """(peak resident bytes of this process during `fn()` above its resident size before,
    fn's result). Linux: the kernel's high-water mark, reset through /proc/self/clear_refs."""

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024

    gc.collect()
    before = status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS: {e}")
    result = fn()
    return status("VmHWM") - before, result


def test_driver_bounded_in_flight_and_memory(ray_local, make_spec, tmp_path, monkeypatch):
    """8 vs 32 units (2 actors x IN_FLIGHT = 4 in flight): the driver never has more than
    4 units out, keeps that many out, and its peak memory does not grow with the corpus
    (the 32-unit corpus is 160 MiB in memory)."""
    widths: list[int] = []
    wait = ray.wait

    def spy(refs, *args, **kwargs):
        widths.append(len(refs))  # the driver waits on every unit it has in flight
        return wait(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "wait", spy)
    bound = 2 * driver.IN_FLIGHT
    growth = {}
    for units in (8, 32):
        corpus = write_wide_corpus(tmp_path / f"in-{units}" / "wide.parquet", units)
        spec = make_spec(tmp_path / f"out-{units}", input=str(corpus), unit_rows=ROWS_PER_UNIT)
        widths.clear()
        growth[units], outcome = peak_rss_growth(lambda: run_job(spec))
        assert outcome.ok, outcome.failed
        assert outcome.report["units_committed"] == units
        assert max(widths) == bound, widths  # full, never fuller
        assert len(widths) >= units
        ids = ds.dataset(spec.output, format="parquet").to_table(columns=["id"]).column("id").to_numpy()
        np.testing.assert_array_equal(np.sort(ids), np.arange(units * ROWS_PER_UNIT))
    in_memory = 32 * ROWS_PER_UNIT * PAYLOAD_BYTES
    assert growth[32] < growth[8] + 32 * MiB, growth
    assert growth[32] < in_memory / 4, growth


def test_cluster_nodes_match_single_process(ray_cluster, make_spec, same_as_reference, tmp_path):
    """Two one-CPU actors on a three-node cluster: each lands on its own node."""
    outcome = run_job(make_spec(tmp_path, backend="ray", num_workers=2))
    assert outcome.ok, outcome.failed
    assert len(outcome.report["workers"]) == 2
    same_as_reference(tmp_path)
