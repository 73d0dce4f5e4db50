"""Launch groups: windows merge until a group holds its token target, the targets doubling."""

from __future__ import annotations

import itertools

import workers.batching
from jobs.plan import list_inputs, plan_units
from states.runtime import Runtime
from workers.batching import group_targets
from workers.unit import UnitRunner


def test_group_targets_double_up_to_the_full_group(monkeypatch):
    monkeypatch.setattr(workers.batching, "FIRST_GROUP_TOKENS", 100)
    monkeypatch.setattr(workers.batching, "GROUP_TOKENS", 1000)
    assert list(itertools.islice(group_targets(), 6)) == [100, 200, 400, 800, 1000, 1000]


def test_windows_join_a_group_until_it_holds_its_target(make_spec, tmp_path, monkeypatch):
    """Each group is the fewest whole windows reaching its target (the last may fall short),
    so the unit's first launch comes after a few small windows, not after a full group."""
    monkeypatch.setattr(workers.batching, "FIRST_GROUP_TOKENS", 300)
    monkeypatch.setattr(workers.batching, "GROUP_TOKENS", 2400)
    spec = make_spec(tmp_path / "o", backend="local", window_rows=64)  # ramp windows 16, 20, 25, ... rows
    unit = plan_units(spec, list_inputs(spec))[0]
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    windows: list[int] = []  # tokens of every window, in order
    submit = runner.tokenizer.submit

    def record_window(rows, segments):
        pending = submit(rows, segments)
        windows.append(pending)
        return pending

    groups: list[int] = []  # tokens of every launch group, in order
    launch = runner._launch

    def record_group(window):
        groups.append(window.tokens)
        return launch(window)

    monkeypatch.setattr(runner.tokenizer, "submit", record_window)
    monkeypatch.setattr(runner, "_launch", record_group)
    result = runner.run(unit)
    sizes = [w.result().tokens for w in windows]
    assert sum(groups) == sum(sizes) == result.tokens
    targets = group_targets()
    start = 0
    for i, total in enumerate(groups):
        target, last = next(targets), i == len(groups) - 1
        stop = start + next(n for n in range(1, len(sizes) - start + 1) if sum(sizes[start : start + n]) >= total)
        assert sum(sizes[start:stop]) == total  # whole windows
        assert total >= target or last
        assert sum(sizes[start : stop - 1]) < target  # no window more than needed
        start = stop
    assert groups[0] < 2 * 300 + max(sizes) and len(groups) >= 4  # the first launch is small
