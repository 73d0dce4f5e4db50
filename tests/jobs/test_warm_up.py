"""The load-time device warm-up runs every pack size a unit can launch, within the budget."""

from __future__ import annotations

import torch

import workers.unit
from workers.unit import WARM_IN_FLIGHT, UnitRunner
from tests.jobs.fixtures_models import runner_args


def test_warm_device_doubles_pack_sizes_up_to_the_largest_group(make_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(workers.batching, "GROUP_TOKENS", 2000)
    runner = UnitRunner(*runner_args(make_spec(tmp_path / "o", backend="local", max_tokens=5000, window_rows=4)))
    longest = runner.runtime.max_length
    biggest = min(5000, 2000 + 4 * longest)  # a full group plus one window of the longest rows
    seen: list[tuple[int, int]] = []
    compute = runner.runtime.launch

    def record(pack):
        seen.append((pack.input_ids.numel(), pack.max_len))
        out = compute(pack)
        assert all(torch.isfinite(v).all() for v in out.values())
        return out

    monkeypatch.setattr(runner.runtime, "launch", record)
    runner.warm_device()
    sizes = [1024, 2048, 4096, biggest] if biggest > 4096 else [1024, 2048, biggest]
    assert [t for t, _ in seen] == [s for s in sizes for _ in range(WARM_IN_FLIGHT)]
    assert max(n for _, n in seen) == longest  # sequences as long as the model takes


def test_warm_device_stays_within_a_shrunken_budget(make_spec, tmp_path, monkeypatch):
    """An out-of-memory error during the warm-up halves the budget once, and the warm-up stops there."""
    runner = UnitRunner(*runner_args(make_spec(tmp_path / "o", backend="local", max_tokens=4096, window_rows=4)))
    seen: list[int] = []
    compute = runner.runtime.launch

    def tight(pack):
        if pack.input_ids.numel() > 1500:
            raise torch.OutOfMemoryError("simulated")
        seen.append(pack.input_ids.numel())
        return compute(pack)

    monkeypatch.setattr(runner.runtime, "launch", tight)
    runner.warm_device()
    assert runner.max_tokens == 2048 and max(seen) <= 1500 and seen[:WARM_IN_FLIGHT] == [1024] * WARM_IN_FLIGHT
