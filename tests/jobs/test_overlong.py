"""Over-length text: truncation is counted; chunking embeds every window of a 1 MB text."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from jobs.driver import run_job
from states.interface import Pack
from states.runtime import ModelOptions, Runtime

MB_TEXT = ("word " * 210_000)[:1_000_000]


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "long.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "text": ["short text", MB_TEXT, "another one"]}), path)
    return path


def _embeddings(out):
    table = pq.read_table(out)
    return table, np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


def test_truncate_counts_overlong_rows(make_spec, long_corpus, tmp_path):
    outcome = run_job(make_spec(tmp_path / "t", input=str(long_corpus), backend="local"))
    assert outcome.ok and outcome.report["rows_truncated"] == 1 and outcome.report["rows"] == 3


def _reference_windows(model_dir, text, stride):
    """Windows from transformers' own overflow logic, embedded one by one (padded path)."""
    runtime = Runtime(ModelOptions(model=str(model_dir), execution="padded", device="cpu"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = tok(text, truncation=True, max_length=runtime.max_length, stride=stride, return_overflowing_tokens=True)
    out = []
    for ids in enc["input_ids"]:
        t = torch.tensor(ids)
        pack = Pack(t, torch.arange(len(ids)), torch.zeros_like(t), torch.tensor([0, len(ids)], dtype=torch.int32), len(ids))
        out.append(runtime.compute(pack)["embedding"][0].numpy())
    return np.stack(out), runtime


def test_chunk_mean_and_none_on_1mb_text(make_spec, long_corpus, tiny_bert, tmp_path):
    stride = 16
    mean_out = run_job(make_spec(tmp_path / "m", input=str(long_corpus), backend="local", overlong="chunk",
                                 chunk_stride=stride))
    none_out = run_job(make_spec(tmp_path / "n", input=str(long_corpus), backend="local", overlong="chunk",
                                 chunk_stride=stride, chunk_aggregate="none"))
    assert mean_out.ok and none_out.ok
    windows, runtime = _reference_windows(tiny_bert, MB_TEXT, stride)
    assert len(windows) > 1000  # a 1 MB text really was split

    table, emb = _embeddings(tmp_path / "m")
    assert table.column("id").to_pylist() == [0, 1, 2]
    want = windows.mean(0)
    if runtime.normalize:
        want /= np.linalg.norm(want)
    cos = emb[1] @ want / (np.linalg.norm(emb[1]) * np.linalg.norm(want))
    assert cos >= 0.9999

    table, emb = _embeddings(tmp_path / "n")
    ids, chunk = table.column("id").to_pylist(), table.column("chunk").to_pylist()
    assert ids == [0] + [1] * len(windows) + [2]
    assert chunk == [0] + list(range(len(windows))) + [0]
    cos = (emb[1:-1] * windows).sum(1) / (np.linalg.norm(emb[1:-1], axis=1) * np.linalg.norm(windows, axis=1))
    assert cos.min() >= 0.9999
