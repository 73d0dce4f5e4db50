"""A worker tokenizes with the backend chosen at load, checks it on its first rows, and
records it in each shard; the output is the same whichever backend ran."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.plan import list_inputs, plan_units
from jobs.spec import JobSpec
from tests.jobs.fixtures_models import corpus_table, runner_args, save_tiny_bert
from workers import token_backends
from workers.tokenize_pool import ThreadTokenizer
from workers.tokenizer_choice import choose_backend
from workers.unit import UnitRunner


@pytest.fixture(scope="module")
def job_input(tmp_path_factory):
    root = tmp_path_factory.mktemp("unit-tokenizer")
    table = corpus_table(120, seed=3)
    texts = table.column("text").to_pylist()
    texts[5] = "Café crème, 中文 and a pooljobs-marker " + "word " * 400  # past truncation, past the bounded prefix
    pq.write_table(table.set_column(1, "text", pa.array(texts)), root / "corpus.parquet", row_group_size=50)
    return save_tiny_bert(root / "model"), root / "corpus.parquet"


@pytest.fixture(autouse=True)
def _fresh_choice(tmp_path, monkeypatch):
    """Each test checks backends anew (the choice is cached per process and on disk)."""
    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    choose_backend.cache_clear()
    yield
    choose_backend.cache_clear()


def _run(job_input, out) -> tuple[dict, pa.Table, UnitRunner]:
    model, corpus = job_input
    spec = JobSpec(input=str(corpus), output=str(out), model=str(model), id_column="id", device="cpu",
                   unit_rows=60, progress=False, window_rows=16)
    runner = UnitRunner(*runner_args(spec), tokenize_in_tasks=True)  # as a GPU worker in Ray: tasks are at hand
    try:
        for unit in plan_units(spec, list_inputs(spec)):
            runner.run(unit)
    finally:
        runner.close()
    shards = sorted((out / "data").glob("*.parquet"))
    provenance = json.loads(pq.read_schema(shards[0]).metadata[b"pooljobs"])
    return provenance, pa.concat_tables(pq.read_table(s).replace_schema_metadata(None) for s in shards), runner


def test_fast_backend_runs_in_threads_and_is_recorded(job_input, tmp_path, monkeypatch):
    provenance, fast, runner = _run(job_input, tmp_path / "fast")
    assert isinstance(runner.tokenizer, ThreadTokenizer)  # auto: a fast backend keeps a worker in threads
    assert (provenance["tokenizer"], provenance["tokenizer_fallback"]) == ("nanotoken", "")
    monkeypatch.setitem(sys.modules, "nanotoken", None)
    choose_backend.cache_clear()
    provenance, slow, _ = _run(job_input, tmp_path / "hf")
    assert provenance["tokenizer"] == "tokenizers" and "nanotoken cannot be imported" in provenance["tokenizer_fallback"]
    assert fast.equals(slow)


def test_a_mismatch_on_the_first_rows_falls_back_for_the_job(job_input, tmp_path, monkeypatch):
    _, want, _ = _run(job_input, tmp_path / "good")
    call = token_backends.NanoContent.__call__

    def broken(self, texts):
        ids, offsets = call(self, texts)
        ids = np.array(ids)
        for i, text in enumerate(texts):
            if "pooljobs-marker" in text:
                ids[offsets[i]] += 1
        return ids, offsets

    monkeypatch.setattr(token_backends.NanoContent, "__call__", broken)
    provenance, got, _ = _run(job_input, tmp_path / "bad")
    assert provenance["tokenizer"] == "reference"
    assert provenance["tokenizer_fallback"].startswith("job rows: nanotoken (bounded prefix) differs from HF tokenizers")
    assert got.equals(want)
