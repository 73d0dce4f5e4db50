"""Warm workers across notebook calls (`jobs.pool`): a model loads once per session and
key; another key, the idle timeout and `jobs.shutdown()` release it. Also the Ray side:
actors kept across calls, placement that names what cannot be placed instead of hanging.

Model loads are counted by wrapping `states.runtime.Runtime` (workers build it there)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

import jobs
from jobs import pool as pools
from jobs.driver import run_job

from tests.jobs.fixtures_models import count_model_loads, save_tiny_bert

TEXTS = [f"row {i}: the pooling job embeds every row once" + " again" * (i % 7) for i in range(30)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pool-models")
    return {head: save_tiny_bert(root / head, head) for head in ("embed", "classify", "score")}


@pytest.fixture
def loads(monkeypatch) -> list:
    """Each model load appends its ModelOptions."""
    yield count_model_loads(monkeypatch)
    pools.shutdown()


def frame() -> pd.DataFrame:
    return pd.DataFrame({"text": TEXTS, "pair": TEXTS[::-1]})


CALLS = {
    "embed": lambda m, **o: jobs.embed(frame(), model=m, **o),
    "classify": lambda m, **o: jobs.classify(frame(), model=m, **o),
    "score": lambda m, **o: jobs.score(frame(), model=m, pair_column="pair", **o),
}
RESULT = {"embed": "embedding", "classify": "probs", "score": "score"}


@pytest.mark.parametrize("task", ["embed", "classify", "score"])
def test_second_call_reuses_the_loaded_model(models, loads, task):
    first = CALLS[task](models[task], backend="local", device="cpu")
    second = CALLS[task](models[task], backend="local", device="cpu")
    assert len(loads) == 1, "the second call with the same model and options loads nothing"
    column = RESULT[task]
    for a, b in zip(first[column], second[column]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert len(pools.idle_keys()) == 1


def test_per_call_options_share_the_pool_and_model_options_do_not(models, loads):
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu")
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu", window_rows=64, output_dtype="float16")
    assert len(loads) == 1, "unit options (batching, output dtype) travel with the call"
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu", dim=16)
    assert len(loads) == 2, "dim shapes the loaded model: a new pool"
    keys = pools.idle_keys()
    assert [k.model_options.dim for k in keys] == [16], "the other key's pool is released"
    jobs.classify(frame(), model=models["classify"], backend="local", device="cpu")
    assert len(loads) == 3 and [k.model_options.task for k in pools.idle_keys()] == ["classify"]


def test_idle_pool_is_released(models, loads, monkeypatch):
    monkeypatch.setattr(pools, "IDLE_SECONDS", 0.3)
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu")
    assert pools.idle_keys()
    deadline = time.monotonic() + 10
    while pools.idle_keys() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pools.idle_keys()
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu")
    assert len(loads) == 2


def test_shutdown_releases_the_pool(models, loads):
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu")
    jobs.shutdown()
    assert not pools.idle_keys()
    jobs.embed(frame(), model=models["embed"], backend="local", device="cpu")
    assert len(loads) == 2


def test_cli_runs_keep_no_pool(models, loads, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.spec import JobSpec

    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "in.parquet")
    spec = JobSpec(input=str(tmp_path / "in.parquet"), output=str(tmp_path / "out"), model=str(models["embed"]),
                   device="cpu", backend="local", progress=False)
    outcome = run_job(spec)
    assert outcome.ok and not pools.idle_keys()
    startup = outcome.report["startup"]
    assert {"plan", "model_load", "warm_up", "claim", "first_output"} <= set(startup), startup
    assert outcome.report["decisions"]["compile"] == "off"  # 30 rows: compiling would not pay


def test_auto_backend_runs_small_cpu_jobs_in_process(models, loads):
    from jobs.driver import choose_backend
    from jobs.spec import JobSpec

    spec = JobSpec(input="x", output="y", model=str(models["embed"]), device="cpu")
    assert choose_backend(spec)[0] == "local"
    assert choose_backend(spec.replace(num_workers=3))[0] == "ray"
    assert choose_backend(spec.replace(address="ray://h:10001"))[0] == "ray"
