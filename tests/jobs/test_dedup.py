"""Each model input computed once within a job, and only what changed across jobs (`--reuse`).

The corpus repeats texts within units, across units and across files, and holds null
texts (quarantined, never copied). A run with dedup must write exactly the rows of a
`--no-dedup` run (same shards, keys, order and quarantine), with each copy's value
byte-equal to its source's, and count what it computed, copied and reused.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.driver import REPO_ROOT, run_job
from jobs.spec import JobSpec, SpecError
from tests.jobs.conftest import WORDS, committed_count, embeddings, one_torch_thread, read_shards
from tests.jobs.fixtures_models import save_tiny_bert
from tests.jobs.test_faults import kill_after_commits
from workers.dedup import HASH_COLUMN

FILES, ROWS, ROW_GROUP, UNIT_ROWS = 2, 300, 50, 100  # 6 units, 3 per file
NULLS = {7, 8, 9, 250, 451}  # rows (across both files) with a null text


def _pool(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 30))) for _ in range(n)]


def corpus_texts() -> list[str | None]:
    """600 rows drawn from 150 texts: repeats within a unit, across units and files."""
    pool, rng = _pool(150, seed=1), random.Random(2)
    return [None if i in NULLS else pool[rng.randrange(len(pool))] for i in range(FILES * ROWS)]


def write_files(directory: Path, texts: list[str | None], extra: list[str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        pq.write_table(pa.table({"id": pa.array(rows, pa.int64()), "text": pa.array([texts[i] for i in rows])}),
                       directory / f"part-{f}.parquet", row_group_size=ROW_GROUP)
    if extra:
        start = FILES * ROWS
        pq.write_table(pa.table({"id": pa.array(range(start, start + len(extra)), pa.int64()), "text": extra}),
                       directory / f"part-{FILES}.parquet", row_group_size=ROW_GROUP)
    return directory


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("dedup-model"))


def spec(model: Path, data: Path, out: Path, **changes) -> JobSpec:
    values = dict(input=str(data), output=str(out), model=str(model), id_column="id", device="cpu",
                  unit_rows=UNIT_ROWS, progress=False, backend="local")
    return JobSpec(**{**values, **changes})


def run(job: JobSpec) -> dict:
    with one_torch_thread():
        outcome = run_job(job)
    assert outcome.ok, outcome.failed
    return outcome.report


def by_id(out: Path) -> dict[int, tuple[bytes, bytes]]:
    """id -> (embedding bytes, content hash) over the whole output."""
    table = pq.read_table(Path(out, "data"), columns=["id", "embedding", HASH_COLUMN])
    values = embeddings(table)
    return {i: (values[k].tobytes(), h) for k, (i, h) in
            enumerate(zip(table.column("id").to_pylist(), table.column(HASH_COLUMN).to_pylist()))}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_files(tmp_path_factory.mktemp("dedup-corpus"), corpus_texts())


@pytest.fixture(scope="module")
def plain(model, corpus, tmp_path_factory) -> tuple[Path, dict]:
    """The corpus run with --no-dedup: every row computed."""
    out = tmp_path_factory.mktemp("plain") / "out"
    return out, run(spec(model, corpus, out, dedup=False))


@pytest.fixture(scope="module")
def deduped(model, corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("deduped") / "out"
    return out, run(spec(model, corpus, out))


def assert_same_rows(got: Path, want: Path, atol: float = 1e-6) -> None:
    """Same shards, keys in the same order, values within `atol`, same quarantine."""
    a, b = read_shards(got), read_shards(want)
    assert sorted(a) == sorted(b)
    for name in b:
        assert a[name].schema == b[name].schema, name
        assert a[name].column("id").to_pylist() == b[name].column("id").to_pylist(), name
        assert a[name].column(HASH_COLUMN).to_pylist() == b[name].column(HASH_COLUMN).to_pylist(), name
        np.testing.assert_allclose(embeddings(a[name]), embeddings(b[name]), rtol=0, atol=atol, err_msg=name)
    errors = [pq.read_table(Path(o, "_errors")).sort_by("id") for o in (got, want)]
    assert errors[0].equals(errors[1])


def test_duplicates_are_computed_once(deduped, plain):
    """Within units, across units and files: one forward per distinct text, every row
    written, each copy byte-equal to the first row with its text, quarantined nulls kept."""
    (out, report), (plain_out, plain_report) = deduped, plain
    texts = corpus_texts()
    usable = [t for t in texts if t is not None]
    assert_same_rows(out, plain_out)
    assert report["rows"] == plain_report["rows"] == len(usable)
    assert report["rows_quarantined"] == len(NULLS)
    assert report["rows_computed"] == len(set(usable))
    assert report["rows_deduplicated"] == len(usable) - len(set(usable)) > 300
    assert plain_report["rows_computed"] == len(usable) and plain_report["rows_deduplicated"] == 0

    rows = by_id(out)
    first: dict[str, int] = {}
    across_files = 0
    for i, text in enumerate(texts):
        if text is None:
            assert i not in rows
            continue
        owner = first.setdefault(text, i)
        assert rows[i] == rows[owner], (i, owner)  # value and content hash
        across_files += owner < ROWS <= i
    assert across_files > 50
    assert len({h for _, h in rows.values()}) == len(set(usable))


def test_cache_off_still_dedups_within_units(model, corpus, plain, tmp_path):
    """dedup_cache_mb=0: a text repeated in another unit is computed there again."""
    report = run(spec(model, corpus, tmp_path / "out", dedup_cache_mb=0))
    assert_same_rows(tmp_path / "out", plain[0])
    texts = corpus_texts()
    per_unit = sum(len({t for t in texts[u:u + UNIT_ROWS] if t is not None}) for u in range(0, len(texts), UNIT_ROWS))
    assert report["rows_computed"] == per_unit


def test_pairs_dedup_by_both_texts(tmp_path):
    """Score pairs: a repeated (text, pair) is copied; the same texts swapped, or split at
    another place, are different inputs."""
    model = save_tiny_bert(tmp_path / "score", head="score")
    pairs = [("a b", "c"), ("a", "b c"), ("c", "a b"), ("a b", "c"), ("x y", "z"), ("a", "b c"), ("x y", "z")] * 3
    pq.write_table(pa.table({"id": range(len(pairs)), "text": [p[0] for p in pairs], "pair": [p[1] for p in pairs]}),
                   tmp_path / "pairs.parquet")
    outs = {}
    for dedup in (True, False):
        job = JobSpec(input=str(tmp_path / "pairs.parquet"), output=str(tmp_path / f"out-{dedup}"), model=str(model),
                      task="score", pair_column="pair", id_column="id", device="cpu", backend="local", progress=False,
                      dedup=dedup)
        outs[dedup] = run(job), pq.read_table(tmp_path / f"out-{dedup}" / "data")
    report, table = outs[True]
    assert report["rows_computed"] == 4 and report["rows_deduplicated"] == len(pairs) - 4
    assert table.column("id").to_pylist() == outs[False][1].column("id").to_pylist()
    scores = table.column("score").to_pylist()
    assert scores[0] == scores[3] and scores[1] == scores[5] and scores[4] == scores[6]
    hashes = table.column(HASH_COLUMN).to_pylist()
    assert len({hashes[0], hashes[1], hashes[2]}) == 3
    np.testing.assert_allclose(scores, outs[False][1].column("score").to_pylist(), rtol=0, atol=1e-6)


def changed_corpus(directory: Path) -> tuple[Path, list[str | None], list[str], set[int]]:
    """The corpus with 4 rows changed in place and a file of 40 rows appended."""
    texts = corpus_texts()
    changed = {3, 120, 333, 598}
    for i in changed:
        texts[i] = f"a changed row number {i} pooling"
    extra = [f"an appended row {i}" for i in range(30)] + _pool(150, seed=1)[:10]  # 10 texts the corpus holds
    return write_files(directory, texts, extra), texts, extra, changed


@pytest.mark.parametrize("moved", [False, True], ids=["in-place", "moved"])
def test_reuse_copies_unchanged_rows(model, moved, tmp_path):
    """After 4 rows changed and 40 appended, --reuse computes only the changed and new
    texts, writes every row in order, and the unchanged rows' values are the previous
    output's bytes: with the input changed in place (shards found by input file), and
    with the new corpus in another directory (found by unit name)."""
    previous = tmp_path / "previous"
    run(spec(model, write_files(tmp_path / "data", corpus_texts()), previous))
    data, texts, extra, changed = changed_corpus(tmp_path / ("moved" if moved else "data"))
    report = run(spec(model, data, tmp_path / "out", reuse=str(previous)))
    fresh = run(spec(model, data, tmp_path / "fresh", dedup=False))
    assert_same_rows(tmp_path / "out", tmp_path / "fresh")
    assert report["rows"] == fresh["rows"]
    assert report["decisions"]["reuse"] == {"from": str(previous), "refused": None,
                                            "matched_by": "unit name" if moved else "input file"}
    new_texts = {texts[i] for i in changed} | set(extra) - set(corpus_texts())
    assert report["rows_computed"] == len(new_texts)
    assert report["rows_reused"] + report["rows_deduplicated"] + report["rows_computed"] == report["rows"]
    assert report["rows_reused"] == report["rows"] - report["rows_computed"]  # one worker: every copy is reused
    before, after = by_id(previous), by_id(tmp_path / "out")
    unchanged = [i for i, t in enumerate(texts) if t is not None and i not in changed]
    assert all(after[i] == before[i] for i in unchanged)


def test_reuse_refused_for_another_option(model, corpus, deduped, tmp_path, capsys):
    """A previous output written with another output option lends nothing, and says why."""
    previous, _ = deduped
    report = run(spec(model, corpus, tmp_path / "out", reuse=str(previous), dim=16))
    why = report["decisions"]["reuse"]["refused"]
    assert "dim=None" in why and "dim=16" in why
    assert report["rows_reused"] == 0 and "nothing reused" in capsys.readouterr().err


@pytest.mark.parametrize("setting, value, why", [
    ("dtype", "bfloat16", "dtype: 'bfloat16' there, 'float32' here"),
    # a shard hashed otherwise (BLAKE2b, before `content_hash` was recorded): its hashes never match
    ("content_hash", None, "content_hash: None there, 'xxh3-128' here"),
])
def test_reuse_refused_by_a_shard_written_otherwise(model, corpus, deduped, tmp_path, setting, value, why):
    """The workers compare each previous shard's resolved provenance: a shard stamped
    with another dtype, or content hashes of another algorithm, lends nothing, and the
    report names the unit and the setting."""
    previous = tmp_path / "previous"
    run(spec(model, corpus, previous))
    shard = sorted((previous / "data").glob("*.parquet"))[0]
    table = pq.read_table(shard)
    stamp = json.loads(table.schema.metadata[b"pooljobs"])
    stamp[setting] = value
    pq.write_table(table.replace_schema_metadata({"pooljobs": json.dumps({k: v for k, v in stamp.items() if v is not None})}), shard)
    report = run(spec(model, corpus, tmp_path / "out", reuse=str(previous)))
    assert report["reuse_refused"] == [{"unit": shard.stem, "why": why}]
    assert_same_rows(tmp_path / "out", deduped[0])


def test_reuse_options_checked_at_the_edge(model, corpus, tmp_path):
    with pytest.raises(SpecError, match="another output"):
        spec(model, corpus, tmp_path / "out", reuse=str(tmp_path / "out"))
    with pytest.raises(SpecError, match="no-dedup"):
        spec(model, corpus, tmp_path / "out", reuse=str(tmp_path / "x"), dedup=False)


def test_reuse_under_a_killed_driver(model, deduped, tmp_path):
    """`python -m jobs.embed --reuse` SIGKILLed after two commits and run again: the output
    is complete and in order, and the unchanged rows still carry the previous bytes. Units
    of one row group here (two there): each takes its rows from the previous shards of its file."""
    previous, _ = deduped
    data, texts, _, changed = changed_corpus(tmp_path / "data")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "jobs.embed", "--input", str(data), "--output", str(out), "--model", str(model),
               "--id-column", "id", "--device", "cpu", "--unit-rows", "25", "--no-progress",
               "--backend", "local", "--reuse", str(previous)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    kill_after_commits(command, env, out, 2, tmp_path / "killed.log")
    done = committed_count(out)
    assert done >= 2 and not (out / "_SUCCESS").exists()
    rerun = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    report = json.loads((out / "_report.json").read_text())
    assert report["units_run_now"] == report["units"] - done > 0 and report["rows_reused"] > 0
    run(spec(model, data, tmp_path / "fresh", dedup=False, unit_rows=25))
    assert_same_rows(out, tmp_path / "fresh")
    before, after = by_id(previous), by_id(out)
    assert all(after[i] == before[i] for i, t in enumerate(texts) if t is not None and i not in changed)


def test_notebook_reuse(model, tmp_path):
    """`jobs.embed(..., reuse=...)`: a table with one row changed copies the others from the
    previous call's output, byte for byte, and the result is row-aligned as always."""
    import jobs

    texts = [t for t in corpus_texts()[:120] if t is not None]
    first = jobs.embed(pa.table({"text": texts}), model=model, output=str(tmp_path / "first"), backend="local",
                       device="cpu").to_table()
    texts[5] = "a changed row pooling"
    again = jobs.embed(pa.table({"text": texts}), model=model, backend="local", device="cpu",
                       reuse=str(tmp_path / "first"))
    want = embeddings(first.sort_by("row_index"))
    got = embeddings(again)
    assert again.num_rows == len(texts) and again.column("error").null_count == len(texts)
    same = [i for i in range(len(texts)) if i != 5]
    assert got[same].tobytes() == want[same].tobytes()
    assert got[5].tobytes() != want[5].tobytes()
