"""Tokenizing in Ray CPU tasks (what GPU workers do) writes the same shards as in-process."""

from __future__ import annotations

import time

import numpy as np

from jobs.plan import list_inputs, plan_units
from workers.tokenize_pool import RayTokenizer, ThreadTokenizer
from workers.unit import UnitRunner


def test_ray_task_tokenizing_matches_in_process(ray_instances, make_spec, tmp_path):
    ray_instances.get("local")
    spec = make_spec(tmp_path / "thread", backend="local", window_rows=7)  # many windows per unit
    units = plan_units(spec, list_inputs(spec))[:2]
    in_process = UnitRunner(spec)
    in_tasks = UnitRunner(spec.replace(output=str(tmp_path / "tasks")), in_process.runtime, tokenize_in_tasks=True)
    assert isinstance(in_tasks.tokenizer, RayTokenizer) and isinstance(in_process.tokenizer, ThreadTokenizer)
    for unit in units:
        want, got = in_process.run(unit), in_tasks.run(unit)
        assert got.tokens == want.tokens > 0 and got.rows == want.rows
        assert got.checksum == want.checksum  # the same bytes
        assert got.seconds["tokenize"] > 0


def test_unit_bytes_do_not_depend_on_tokenizing_speed(make_spec, tmp_path, monkeypatch):
    """Launch groups follow window sizes, never which windows happen to be tokenized by
    then: packs, hence float results, hence shard bytes, are the same on a rerun."""
    import workers.tokenize_pool as pool

    # Small packs: float results of a row depend on its pack's size on CPU too.
    spec = make_spec(tmp_path / "fast", backend="local", window_rows=7, max_tokens=300)
    unit = plan_units(spec, list_inputs(spec))[0]
    fast_runner = UnitRunner(spec)
    fast = fast_runner.run(unit)
    encode = pool.encode_window

    def slow(*args):
        time.sleep(0.02)  # the device side always finds the next window not ready yet
        return encode(*args)

    monkeypatch.setattr(pool, "encode_window", slow)
    slow_result = UnitRunner(spec.replace(output=str(tmp_path / "slow")), fast_runner.runtime).run(unit)
    assert slow_result.tokens == fast.tokens and slow_result.checksum == fast.checksum


def test_first_window_launches_before_the_last_is_sent(make_spec, tmp_path, monkeypatch):
    """Sending windows to Ray tasks costs milliseconds each; the device must not wait
    for all of a unit's windows to be sent before it starts on the first."""
    import workers.unit

    monkeypatch.setattr(workers.unit, "GROUP_TOKENS", 1)  # every window launches alone
    spec = make_spec(tmp_path / "o", backend="local", window_rows=7)
    unit = plan_units(spec, list_inputs(spec))[0]
    runner = UnitRunner(spec)
    events: list[str] = []
    submit, compute = runner.tokenizer.submit, runner.runtime.compute

    def slow_submit(*args):
        time.sleep(0.02)
        events.append("sent")
        return submit(*args)

    runner.tokenizer.submit = slow_submit
    runner.runtime.compute = lambda pack: (events.append("launch"), compute(pack))[1]
    result = runner.run(unit)
    assert result.rows > 0 and events.count("sent") > 3
    assert events.index("launch") < len(events) - 1 - events[::-1].index("sent")  # a launch before the last send


def test_warm_up_builds_the_tokenizer_in_task_processes(ray_instances, make_spec, tmp_path):
    ray_instances.get("local")
    runner = UnitRunner(make_spec(tmp_path, backend="local"), tokenize_in_tasks=True)
    runner.tokenizer.warm_up()  # no error, and a window after it still tokenizes
    window = runner.tokenizer.submit(np.arange(2), ["alpha beta", ""], None).result()
    assert window.kept.tolist() == [0, 1] and window.encoded.lengths.tolist()[1] == 2  # [CLS] [SEP] only
