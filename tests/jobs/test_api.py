"""The notebook API (`jobs.embed` / `classify` / `score`) against the job it wraps.

Results must equal the CLI job's shards row for row, whatever the input type (pandas,
pyarrow, polars) and backend. One Ray session per module: the first `backend="ray"`
call starts a loopback Ray, later calls reuse it, the `ray_session` fixture stops it. A
Ray job costs ~20 s on a shared 2-core machine (its actor process imports torch), so the
Ray path runs one input type: the type conversions happen in this process and are
compared on the local backend.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import jobs
from jobs.driver import run_job
from jobs.spec import JobSpec, SpecError
from workers.reader import InputError

from tests.jobs.fixtures_models import LABELS
from tests.jobs.fixtures_models import save_tiny_bert as tiny_bert

WORDS = "the pooling job embeds every row once across workers and retries shards manifest resume".split()
NULL_ROW, EMPTY_ROW = 3, 5


def texts(n: int = 40) -> list[str | None]:
    """Distinct texts of 1..60 words (so the worker's length sort reorders them), one None, one empty."""
    rng = np.random.default_rng(0)
    out = [f"row {i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 60)))) for i in range(n)]
    out[NULL_ROW], out[EMPTY_ROW] = None, ""
    return out


def frame(kind: str = "pandas"):
    """The test rows with an extra column and a non-default index, as `kind`."""
    df = pd.DataFrame({"text": texts(), "n": range(40)}, index=[f"r{i}" for i in range(40)])
    if kind == "arrow":
        return pa.Table.from_pandas(df, preserve_index=False)
    if kind == "polars":
        return pl.from_pandas(df)
    return df


def column(result, name: str) -> list:
    """A result column as Python values (arrays as lists, nulls as None), whatever the type."""
    if isinstance(result, pd.DataFrame):
        return [v.tolist() if isinstance(v, np.ndarray) else None if pd.isna(v) else v for v in result[name]]
    if isinstance(result, pl.DataFrame):
        return result[name].to_list()
    return result.column(name).to_pylist()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api-models")
    return {head: tiny_bert(root / head, head) for head in ("embed", "classify", "score")}


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory) -> tuple[dict[int, list], dict[int, str]]:
    """The CLI job on the same rows: (id -> embedding, id -> quarantine reason)."""
    root = tmp_path_factory.mktemp("api-reference")
    pq.write_table(pa.table({"id": range(40), "text": texts()}), root / "in.parquet")
    outcome = run_job(JobSpec(input=str(root / "in.parquet"), output=str(root / "out"), model=str(models["embed"]),
                              id_column="id", backend="local", device="cpu", progress=False))
    assert outcome.ok, outcome.failed
    shards = pq.read_table(root / "out", columns=["id", "embedding"])
    errors = pq.read_table(root / "out" / "_errors")
    embeddings = dict(zip(shards.column("id").to_pylist(), shards.column("embedding").to_pylist()))
    return embeddings, dict(zip(errors.column("id").to_pylist(), errors.column("reason").to_pylist()))


@pytest.fixture(scope="module")
def ray_session():
    """Stop at module end the Ray that the first `backend="ray"` call starts."""
    import ray

    started_here = not ray.is_initialized()
    yield
    if started_here:
        ray.shutdown()


@pytest.mark.parametrize("kind, backend", [("pandas", "local"), ("arrow", "local"), ("polars", "local"),
                                           ("pandas", "ray")])
def test_embed_matches_the_job_row_for_row(models, reference, kind, backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    data = frame(kind)
    result = jobs.embed(data, model=models["embed"], backend=backend, device="cpu")
    want_embeddings, want_errors = reference
    assert type(result) is type(data)
    assert column(result, "text") == texts() and column(result, "n") == list(range(40))
    if kind == "pandas":
        assert list(result.index) == list(data.index)
    got = column(result, "embedding")
    errors = column(result, "error")
    assert errors == [want_errors.get(i) for i in range(40)]
    assert errors[NULL_ROW] == "null text" and got[NULL_ROW] is None
    for i in range(40):
        if i != NULL_ROW:
            np.testing.assert_allclose(got[i], want_embeddings[i], rtol=0, atol=1e-6, err_msg=f"row {i}")
    if backend == "ray":
        import ray

        assert ray.is_initialized(), "a local Ray started for a call stays for the next call"


def hf_logits(model_dir: Path, first: list[str], second: list[str] | None = None) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(**tok(first, second, padding=True, return_tensors="pt")).logits.numpy()


def test_classify_adds_label_probs_logits(models):
    result = jobs.classify(frame("arrow"), model=models["classify"], backend="local", device="cpu")
    ok = [i for i in range(40) if i != NULL_ROW]
    logits = np.array([column(result, "logits")[i] for i in ok])
    probs = np.array([column(result, "probs")[i] for i in ok])
    want = hf_logits(models["classify"], [texts()[i] for i in ok])
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(probs, np.exp(want) / np.exp(want).sum(1, keepdims=True), rtol=0, atol=1e-5)
    assert [column(result, "label")[i] for i in ok] == [LABELS["classify"][k] for k in probs.argmax(1)]
    assert column(result, "label")[NULL_ROW] is None and column(result, "probs")[NULL_ROW] is None
    assert column(result, "error")[NULL_ROW] == "null text"


def test_score_pairs(models):
    data = frame("polars").with_columns(pl.Series("passage", [f"passage {i}" for i in range(40)]))
    data = data.with_columns(pl.when(pl.col("n") == 7).then(None).otherwise(pl.col("passage")).alias("passage"))
    result = jobs.score(data, model=models["score"], pair_column="passage", backend="local", device="cpu")
    assert isinstance(result, pl.DataFrame) and result.columns == [*data.columns, "score", "logits", "error"]
    errors = column(result, "error")
    assert errors[NULL_ROW] == "null text" and errors[7] == "passage: null text"
    ok = [i for i in range(40) if errors[i] is None]
    assert len(ok) == 38
    want = hf_logits(models["score"], [texts()[i] for i in ok], [f"passage {i}" for i in ok])[:, 0]
    scores = np.array([column(result, "score")[i] for i in ok])
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-want)), rtol=0, atol=1e-5)
    assert column(result, "score")[7] is None


def test_output_returns_a_dataset_and_reruns_resume(models, reference, tmp_path):
    out, stage = tmp_path / "out", tmp_path / "stage"
    data = frame()
    dataset = jobs.embed(data, model=models["embed"], backend="local", device="cpu", output=str(out),
                         staging=str(stage))
    assert isinstance(dataset, ds.Dataset)
    table = dataset.to_table()
    assert table.column_names == ["row_index", "embedding", "content_hash"]
    assert table.column("row_index").to_pylist() == [i for i in range(40) if i != NULL_ROW]
    want = reference[0]
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()),
                               np.array([want[i] for i in table.column("row_index").to_pylist()]), rtol=0, atol=1e-6)
    assert pq.read_table(out / "_errors").column("row_index").to_pylist() == [NULL_ROW]
    assert (out / "_SUCCESS").exists() and list(stage.iterdir()) == []  # staged input removed

    again = jobs.embed(data, model=models["embed"], backend="local", device="cpu", output=str(out),
                       staging=str(stage))
    assert again.files == dataset.files
    assert json.loads((out / "_report.json").read_text())["units_run_now"] == 0

    by_id = jobs.embed(data, model=models["embed"], backend="local", device="cpu", output=str(tmp_path / "by_n"),
                       id_column="n", unit_rows=16)
    assert len(by_id.files) == 3  # 40 rows staged in row groups of 16
    assert by_id.to_table().column("n").to_pylist() == [i for i in range(40) if i != NULL_ROW]


def test_bad_calls_raise_the_clis_errors(models):
    df, model = frame(), models["embed"]
    with pytest.raises(SpecError, match="unknown key 'poolng'"):
        jobs.embed(df, model=model, poolng="mean")
    with pytest.raises(SpecError, match="pooling='sum' is not valid"):
        jobs.embed(df, model=model, pooling="sum")
    with pytest.raises(SpecError, match="input is set by jobs.embed"):
        jobs.embed(df, model=model, input="x.parquet")
    with pytest.raises(SpecError, match="id_column .* needs output="):
        jobs.embed(df, model=model, id_column="n")
    with pytest.raises(SpecError, match="chunk_aggregate='none' .* pass output="):
        jobs.embed(df, model=model, overlong="chunk", chunk_aggregate="none", backend="local")
    with pytest.raises(InputError, match="no column 'body'"):
        jobs.embed(df, model=model, text_column="body", backend="local")
    with pytest.raises(TypeError, match="pandas DataFrame, a polars DataFrame or a pyarrow Table"):
        jobs.embed(texts(), model=model)
    with pytest.raises(SpecError, match="staging="):
        jobs.embed(df, model=model, address="ray://head:10001")
    with pytest.raises(jobs.JobFailedError, match=f"row {NULL_ROW}: null text"):
        jobs.embed(df, model=model, backend="local", device="cpu", on_error="fail", max_retries=0)


def test_ctrl_c_kills_the_actors_and_removes_the_staging(models, ray_session, tmp_path, monkeypatch):
    """KeyboardInterrupt in the driver's loop (here from the progress update) reaches the
    caller after the driver's `finally` killed the actors; no worker process survives."""
    import ray

    from jobs.progress import Progress

    def interrupt(self, rows, tokens):
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "update", interrupt)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = set(ray._private.state.actors())
    # Holding the exception keeps the driver's frames, and so its actor handles, alive: the
    # actors must die because the driver killed them, not because their handles were freed.
    with pytest.raises(KeyboardInterrupt) as interrupted:
        jobs.embed(frame(), model=models["embed"], backend="ray", device="cpu")
    assert not list(tmp_path.glob("pooljobs-*"))
    # `ray.util.state.list_actors` needs the dashboard, which a loopback Ray runs without;
    # the GCS actor table is the same record.
    deadline = time.monotonic() + 60
    while True:
        actors = [a for k, a in ray._private.state.actors().items() if a["ActorClassName"] == "WorkerActor"
                  and k not in before]
        alive = [a for a in actors if a["State"] != "DEAD"]
        running = [a["Pid"] for a in actors if a["Pid"] and _running(a["Pid"])]
        if not alive and not running or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert actors, "the job started worker actors"
    assert not alive and not running, f"orphaned actors: {alive}, processes {running}"
    assert interrupted.traceback  # still held


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
