"""Tokenizing in Ray CPU tasks (what GPU workers do) writes the same shards as in-process."""

from __future__ import annotations

import time

import numpy as np

from jobs.plan import list_inputs, plan_units
from states.runtime import Runtime
from tests.jobs.fixtures_models import runner_args
from workers.tokenize_pool import RayTokenizer, ThreadTokenizer
from workers.unit import UnitRunner


def test_ray_task_tokenizing_matches_in_process(ray_instances, make_spec, tmp_path):
    ray_instances.get("local")
    spec = make_spec(tmp_path / "thread", backend="local", window_rows=7)  # many windows per unit
    units = plan_units(spec, list_inputs(spec))[:2]
    in_process = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    in_tasks = UnitRunner(spec.replace(output=str(tmp_path / "tasks"), tokenize_in="tasks").unit_options, in_process.runtime)
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
    fast_runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    fast = fast_runner.run(unit)
    encode = pool.encode_window

    def slow(*args):
        time.sleep(0.02)  # the device side always finds the next window not ready yet
        return encode(*args)

    monkeypatch.setattr(pool, "encode_window", slow)
    slow_result = UnitRunner(spec.replace(output=str(tmp_path / "slow")).unit_options, fast_runner.runtime).run(unit)
    assert slow_result.tokens == fast.tokens and slow_result.checksum == fast.checksum


def test_first_window_launches_before_the_last_is_sent(make_spec, tmp_path, monkeypatch):
    """Sending windows to Ray tasks costs milliseconds each; the device must not wait
    for all of a unit's windows to be sent before it starts on the first."""
    import workers.unit

    monkeypatch.setattr(workers.batching, "GROUP_TOKENS", 1)  # every window launches alone
    spec = make_spec(tmp_path / "o", backend="local", window_rows=7)
    unit = plan_units(spec, list_inputs(spec))[0]
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    events: list[str] = []
    submit, compute = runner.tokenizer.submit, runner.runtime.launch

    def slow_submit(*args):
        time.sleep(0.02)
        events.append("sent")
        return submit(*args)

    runner.tokenizer.submit = slow_submit
    runner.runtime.launch = lambda pack: (events.append("launch"), compute(pack))[1]
    result = runner.run(unit)
    assert result.rows > 0 and events.count("sent") > 3
    assert events.index("launch") < len(events) - 1 - events[::-1].index("sent")  # a launch before the last send


def test_warm_up_builds_the_tokenizer_in_task_processes(ray_instances, make_spec, tmp_path):
    """After the warm-up, tasks side by side on every CPU all find their process's tokenizer built."""
    import ray

    ray_instances.get("local")
    runner = UnitRunner(*runner_args(make_spec(tmp_path, backend="local", tokenize_in="tasks")))
    free = int(ray.available_resources()["CPU"])
    runner.tokenizer.warm_up()

    def has_tokenizer(key: str) -> bool:  # in a task process: was its tokenizer built before this task?
        import workers.tokenize_pool

        time.sleep(0.5)  # side by side with the others, so each takes a process of its own
        return key in workers.tokenize_pool._BUILT

    probe = ray.remote(has_tokenizer).options(**runner.tokenizer._options)
    assert all(ray.get([probe.remote(runner.tokenizer.key) for _ in range(free)]))
    part = runner.tokenizer.put(["alpha beta", ""], None)
    window = runner.tokenizer.submit(np.arange(2), [(part, np.arange(2))]).result()
    assert window.kept.tolist() == [0, 1] and window.encoded.lengths.tolist()[1] == 2  # [CLS] [SEP] only


def test_warm_up_task_tokenizes_a_window_through_the_task_path(ray_instances, make_spec, tmp_path, monkeypatch):
    """A warm-up task runs a window as a window's task does (its part fetched from the
    object store), not only builds the tokenizer: with only the tokenizer built, a first
    run's first windows took 0.3-0.5 s each in their tasks on the H200."""
    import workers.tokenize_pool as pool

    ray_instances.get("local")
    tokenizer = UnitRunner(*runner_args(make_spec(tmp_path, backend="local", tokenize_in="tasks"))).tokenizer
    windows, encode = [], pool._encode_task
    monkeypatch.setattr(pool, "_encode_task", lambda *args: windows.append(encode(*args)) or windows[-1])
    segments = [(tokenizer.put(["pooljobs warm-up"], None), np.zeros(1, np.int64))]
    pool._warm_task(tokenizer.key, [tokenizer._spec_ref], segments, 0.0)
    assert len(windows) == 1 and windows[0].kept.tolist() == [0] and windows[0].tokens > 2


def test_warm_up_runs_again_when_tasks_shared_a_process(ray_instances, make_spec, tmp_path, monkeypatch):
    """A round that found fewer processes than tasks is repeated, up to `rounds` times."""
    import ray

    import workers.tokenize_pool as pool

    ray_instances.get("local")
    runner = UnitRunner(*runner_args(make_spec(tmp_path, backend="local", tokenize_in="tasks")))
    free = int(ray.available_resources()["CPU"])
    calls: list[int] = []
    real_get = ray.get

    def one_process(refs):  # every round reports a single process
        calls.append(len(refs))
        return ["node:1"] * len(real_get(refs))

    monkeypatch.setattr(ray, "get", one_process)
    runner.tokenizer.warm_up(rounds=3)
    monkeypatch.undo()
    assert calls == [free] * 3 if free > 1 else calls == [1]


def test_first_window_is_sent_before_the_unit_is_read_whole(make_spec, tmp_path, monkeypatch):
    """A unit is read in parts (its first rows, then the rest) and its first windows go
    to the tokenizer before the rest is read; the windows, so the shard's bytes and its
    quarantined rows, are the same as when the unit is read in one part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import workers.reader
    import workers.unit

    texts = [f"row {i} " + "pooling " * (i % 9) for i in range(300)]
    texts[5] = texts[150] = None  # a bad row in each part shifts the usable rows' numbering
    pq.write_table(pa.table({"id": range(300), "text": texts}), tmp_path / "in.parquet", row_group_size=200)
    monkeypatch.setattr(workers.reader, "PART_ROWS", 150)  # parts end inside row groups
    read_parts = workers.feed.read_unit_parts
    events: list[str] = []

    def watched_parts(*args):
        for part in read_parts(*args):
            events.append("read")
            yield part

    def run(name: str, parts) -> tuple[object, list[np.ndarray]]:
        monkeypatch.setattr(workers.feed, "read_unit_parts", parts)
        spec = make_spec(tmp_path / name, backend="local", input=str(tmp_path / "in.parquet"), window_rows=32, unit_rows=300)
        runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
        sent, submit = [], runner.tokenizer.submit
        runner.tokenizer.submit = lambda rows, *a: (events.append("sent"), sent.append(rows), submit(rows, *a))[2]
        return runner.run(plan_units(spec, list_inputs(spec))[0]), sent

    parted, sent = run("parts", watched_parts)
    assert events[0] == "read" and events.count("read") == 2 and events.index("sent") < events.index("read", 1)
    usable = [i for i, t in enumerate(texts) if t is not None]
    assert np.concatenate(sent).tolist() == usable  # every usable row once, in order
    sizes = [len(rows) for rows in sent]
    assert sizes[:4] == [16, 20, 25, 31] and set(sizes[4:-1]) == {32}  # the ramp over usable rows, parts aside
    whole, whole_sent = run("whole", lambda *args: iter([pa.concat_tables(read_parts(*args))]))
    assert [r.tolist() for r in whole_sent] == [r.tolist() for r in sent]
    assert (parted.checksum, parted.errors, parted.rows) == (whole.checksum, whole.errors, whole.rows) == (whole.checksum, 2, 298)
    errors = pq.read_table(tmp_path / "parts" / "_errors")
    assert sorted(errors.column("row").to_pylist()) == [5, 150]


def test_units_take_the_device_in_the_order_they_were_called(make_spec, tmp_path, monkeypatch):
    """Two units in flight (as in the actor): the first called launches first even when
    its thread is slower to get going. Its windows are read and tokenized first, so a
    second unit that took the device first would wait on windows queued behind them
    (0.5 s of a bert-base run on the H200)."""
    import threading

    import workers.unit

    spec = make_spec(tmp_path / "o", backend="local", window_rows=7)
    first, second = plan_units(spec, list_inputs(spec))[:2]
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    launches, compute = [], runner.runtime.launch
    current = threading.local()

    class SlowFirst(workers.unit.ShardWriter):
        def __init__(self, uri, *args):
            if first.name in uri:
                time.sleep(0.3)  # the first unit's thread is late to ask for the device
            super().__init__(uri, *args)

    def run(unit):
        current.unit = unit.name
        return runner.run(unit)

    monkeypatch.setattr(workers.unit, "ShardWriter", SlowFirst)
    runner.runtime.launch = lambda pack: (launches.append(current.unit), compute(pack))[1]
    called = threading.Thread(target=run, args=(first,))
    called.start()
    time.sleep(0.05)  # `run(first)` is called first
    run(second)
    called.join()
    assert launches[0] == first.name and launches == sorted(launches, key=[first.name, second.name].index)
