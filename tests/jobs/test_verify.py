"""`jobs.verify` accepts a clean output and names each kind of damage."""

import shutil

import pyarrow.parquet as pq
import pytest

from jobs.driver import run_job
from jobs.verify import main as verify_main
from jobs.verify import verify


@pytest.fixture(scope="module")
def clean_output(make_spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "out"
    assert run_job(make_spec(out, backend="local", id_column=None)).ok
    return out


@pytest.fixture
def output(clean_output, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(clean_output, copy)
    return copy


def test_clean_output_verifies_with_reference(output, capsys):
    assert verify_main([str(output), "--reference", "6"]) == 0
    text = capsys.readouterr().out
    assert "3,200 rows" in text and "reference min cosine" in text and "OK" in text


def test_tampered_shard_fails_checksum(output):
    shard = sorted(output.glob("data/part-*.parquet"))[3]
    table = pq.read_table(shard)
    pq.write_table(table.slice(1), shard)
    result = verify(str(output))
    assert not result.ok and any("checksum" in p and shard.stem in p for p in result.problems)


def test_missing_commit_record(output):
    record = sorted((output / "_manifest").glob("*.json"))[0]
    record.unlink()
    assert verify(str(output)).problems == [f"{record.stem}: not committed"]


def test_dropped_row_is_found_even_with_matching_checksum(output):
    import hashlib
    import json

    shard = sorted(output.glob("data/part-*.parquet"))[0]
    table = pq.read_table(shard)
    pq.write_table(table.slice(0, table.num_rows - 1).replace_schema_metadata(table.schema.metadata), shard)
    record_path = output / "_manifest" / f"{shard.stem}.json"
    record = json.loads(record_path.read_text())
    record["checksum"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    record_path.write_text(json.dumps(record))
    problems = verify(str(output)).problems
    assert problems == [f"{shard.stem}: output + quarantine rows differ from the input rows of "
                        f"{pq.read_table(shard).column('row_key')[0].as_py().rsplit('#', 1)[0]}"]


def test_not_a_pooljobs_output(tmp_path):
    (tmp_path / "x").mkdir()
    assert verify_main([str(tmp_path / "x")]) == 1


def test_unit_with_every_row_quarantined_keeps_the_shard_schema(make_spec, tmp_path):
    """Such a unit still writes its (empty) embedding column, so shards share one schema."""
    import pyarrow as pa

    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["alpha", "beta gamma"]}), data / "0.parquet")
    pq.write_table(pa.table({"id": ["c", "d"], "text": pa.array([None, None], pa.string())}), data / "1.parquet")
    out = tmp_path / "out"
    outcome = run_job(make_spec(out, input=str(data), backend="local"))
    assert outcome.ok and outcome.report["rows_quarantined"] == 2
    schemas = {pq.read_schema(p).remove_metadata() for p in out.glob("data/part-*.parquet")}
    assert len(schemas) == 1 and "embedding" in next(iter(schemas)).names
    result = verify(str(out))
    assert result.ok, result.problems
