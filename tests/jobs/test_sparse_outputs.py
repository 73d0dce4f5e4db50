"""Sparse and multivector outputs through the notebook API (backend=local) and the CLI,
accepted by `jobs.verify`, against sentence-transformers on the same tiny models, and a
BGE-M3's three outputs against FlagEmbedding's formulas."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import jobs
from jobs.cli import main
from jobs.verify import Reference, verify
from tests.sparse_models import m3_reference, save_colbert, save_m3, save_splade

TEXTS = ["the quick brown fox, jumps!", "", "Engineers debug Ray jobs all day; and all night.", None, "a dog"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return save_splade(root / "splade"), save_colbert(root / "colbert")


def test_api_sparse_and_multivector(models):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

    splade, colbert = models
    table = pa.table({"text": TEXTS})
    out = jobs.embed(table, model=str(splade), backend="local", device="cpu", outputs="dense,sparse")
    assert {"embedding", "sparse_indices", "sparse_values", "error"} <= set(out.column_names)
    assert out.schema.field("sparse_indices").type == pa.list_(pa.field("item", pa.int32(), nullable=False))
    good = [i for i, t in enumerate(TEXTS) if t is not None]
    want = SparseEncoder(str(splade), device="cpu").encode([TEXTS[i] for i in good], convert_to_tensor=True)
    want = want.to_dense().numpy()
    for row, ref in zip(good, want):
        indices = np.asarray(out.column("sparse_indices")[row].as_py())
        np.testing.assert_array_equal(indices, np.nonzero(ref)[0])
        np.testing.assert_allclose(out.column("sparse_values")[row].as_py(), ref[indices], rtol=1e-5, atol=1e-5)
    assert out.column("error")[3].as_py() is not None and out.column("sparse_values")[3].as_py() is None

    frame = jobs.embed(table.to_pandas(), model=str(colbert), backend="local", device="cpu", output_dtype="float16")
    want = MultiVectorEncoder(str(colbert), device="cpu").encode_document([TEXTS[i] for i in good])
    for row, ref in zip(good, want):
        got = np.stack(frame["multivector"][row]).astype(np.float32)
        np.testing.assert_allclose(got, np.asarray(ref), atol=2e-3)


def test_pending_widths_across_many_launch_groups(models, monkeypatch, tmp_path):
    """Every positive weight (the default sparse output, its width the device's) over many
    launch groups of several packs each: each group is handed on behind the next one
    (`workers.unit`), and the shard still holds every row once, in input order, with its
    own weights."""
    from sentence_transformers import SparseEncoder

    from tests.states.hf_reference import random_texts

    splade, _ = models
    monkeypatch.setattr("workers.batching.FIRST_GROUP_TOKENS", 64)
    monkeypatch.setattr("workers.batching.GROUP_TOKENS", 128)
    texts = random_texts(120, seed=3)
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), tmp_path / "in.parquet")
    argv = ["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--model", str(splade),
            "--id-column", "id", "--device", "cpu", "--backend", "local", "--no-progress", "--max-tokens", "48",
            "--window-rows", "8"]
    assert main("jobs.embed", "", ("embed",), argv, {"task": "embed"}) == 0
    out = pq.read_table(tmp_path / "out" / "data")
    assert out.column("id").to_pylist() == list(range(len(texts)))
    want = SparseEncoder(str(splade), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    for row, ref in enumerate(want):
        indices = np.asarray(out.column("sparse_indices")[row].as_py())
        np.testing.assert_array_equal(indices, np.nonzero(ref)[0])
        np.testing.assert_allclose(out.column("sparse_values")[row].as_py(), ref[indices], rtol=1e-5, atol=1e-5)


def test_cli_writes_what_verify_accepts(models, tmp_path):
    splade, colbert = models
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), src)
    for name, model, extra in (("s", splade, ["--sparse-top-k", "8"]), ("m", colbert, ["--outputs", "multivector"])):
        argv = ["--input", str(src), "--output", str(tmp_path / name), "--model", str(model), "--id-column", "id",
                "--device", "cpu", "--backend", "local", "--no-progress", *extra]
        assert main("jobs.embed", "", ("embed",), argv, {"task": "embed"}) == 0
        result = verify(str(tmp_path / name), reference=Reference(4, str(model)))
        assert result.ok and result.min_cos > 0.99999, result.problems
    shard = pq.read_table(tmp_path / "s" / "data")
    assert max(len(r) for r in shard.column("sparse_indices").to_pylist()) <= 8
    assert shard.column("id").to_pylist() == [0, 1, 2, 4]
    multi = pq.read_table(tmp_path / "m" / "data")
    assert multi.schema.field("multivector").type.value_type == pa.list_(
        pa.field("item", pa.float32(), nullable=False), 16)


def test_output_options_are_checked(models, tmp_path):
    splade, _ = models
    base = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--model", str(splade), "--device", "cpu"]
    for extra in (["--outputs", "dense,bogus"], ["--outputs", "sparse", "--overlong", "chunk"],
                  ["--outputs", "multivector", "--output-dtype", "ubinary"], ["--outputs", "dense", "--sparse-top-k", "4"]):
        assert main("jobs.embed", "", ("embed",), base + extra, {"task": "embed"}) == 2


def test_sparse_needs_a_fill_mask_head(models, tmp_path, capsys):
    _, colbert = models  # an encoder without its MLM head
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a b"]}), src)
    argv = ["--input", str(src), "--output", str(tmp_path / "o"), "--model", str(colbert), "--device", "cpu",
            "--backend", "local", "--no-progress", "--outputs", "sparse"]
    assert main("jobs.embed", "", ("embed",), argv, {"task": "embed"}) == 2
    assert "masked-language-model head" in capsys.readouterr().err


def test_dry_run_names_the_columns(models, tmp_path, capsys):
    splade, _ = models
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a b", "c"]}), src)
    argv = ["--input", str(src), "--output", str(tmp_path / "o"), "--model", str(splade), "--device", "cpu",
            "--backend", "local", "--outputs", "dense,sparse", "--dry-run"]
    assert main("jobs.embed", "", ("embed",), argv, {"task": "embed"}) == 0
    printed = capsys.readouterr().out
    assert "sparse_indices" in printed and "list<item: int32 not null>" in printed and "embedding" in printed


def test_m3_three_outputs_through_the_api_and_cli(tmp_path_factory, tmp_path):
    m3 = save_m3(tmp_path_factory.mktemp("m3") / "bge-m3")
    table = pa.table({"id": list(range(len(TEXTS))), "text": TEXTS})
    out = jobs.embed(table, model=str(m3), backend="local", device="cpu", outputs="dense,sparse,multivector")
    good = [i for i, t in enumerate(TEXTS) if t is not None]
    dense, lexical, colbert = m3_reference(m3, [TEXTS[i] for i in good])
    np.testing.assert_allclose(np.stack([out.column("embedding")[i].as_py() for i in good]), dense, atol=1e-5)
    for row, ref, vectors in zip(good, lexical, colbert):
        assert out.column("sparse_indices")[row].as_py() == sorted(ref)
        np.testing.assert_allclose(out.column("sparse_values")[row].as_py(), [ref[i] for i in sorted(ref)], atol=1e-5)
        np.testing.assert_allclose(np.asarray(out.column("multivector")[row].as_py()), vectors, atol=1e-5)

    src = tmp_path / "in.parquet"
    pq.write_table(table, src)
    argv = ["--input", str(src), "--output", str(tmp_path / "o"), "--model", str(m3), "--id-column", "id",
            "--device", "cpu", "--backend", "local", "--no-progress", "--outputs", "dense,sparse,multivector",
            "--output-dtype", "float16", "--sparse-top-k", "4"]
    assert main("jobs.embed", "", ("embed",), argv, {"task": "embed"}) == 0
    assert verify(str(tmp_path / "o")).ok
    checked = verify(str(tmp_path / "o"), reference=Reference(4, str(m3)))  # FlagEmbedding's formulas
    assert checked.ok, checked.problems
    shard = pq.read_table(tmp_path / "o" / "data")
    half = pa.list_(pa.field("item", pa.float16(), nullable=False), 32)
    assert shard.schema.field("multivector").type.value_type == half
    assert shard.schema.field("sparse_values").type == pa.list_(pa.field("item", pa.float32(), nullable=False))
    provenance = json.loads(shard.schema.metadata[b"pooljobs"])
    for kind in ("sparse", "multivector"):
        assert json.loads(provenance[kind])["semantics"] == "bge-m3"
    for row, ref, vectors in zip(shard.to_pylist(), lexical, colbert):
        best = sorted(sorted(ref, key=lambda i: -ref[i])[:4])
        assert row["sparse_indices"] == best
        np.testing.assert_allclose(np.asarray(row["multivector"], np.float32), vectors, atol=2e-3)
