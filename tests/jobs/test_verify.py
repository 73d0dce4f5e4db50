"""`jobs.verify` accepts a clean output and names each kind of damage; its reference is
sentence-transformers / transformers from the model its own command line names."""

import json
import shutil

import numpy as np

import pyarrow.parquet as pq
import pytest

from jobs.driver import run_job
from jobs.verify import main as verify_main
from jobs.verify import Reference, Verification, _compare, verify


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


def test_clean_output_verifies_with_reference(output, tiny_bert, capsys):
    assert verify_main([str(output), "--reference", "6", "--model", str(tiny_bert)]) == 0
    text = capsys.readouterr().out
    assert "3,200 rows" in text and "reference min cosine" in text and "OK" in text


def test_reference_needs_a_model_on_the_command_line(output, capsys):
    with pytest.raises(SystemExit) as exit_info:
        verify_main([str(output), "--reference", "6"])
    assert exit_info.value.code == 2 and "--reference needs --model" in capsys.readouterr().err


def test_reference_with_another_model_is_a_problem(output, tiny_model):
    problems = verify(str(output), reference=Reference(4, str(tiny_model("bert")))).problems
    assert problems == [f"--model {tiny_model('bert')} is not the model the job ran (its files' sha256 differs)"]


def test_doctored_job_file_runs_no_code(output, tiny_bert, tmp_path):
    """_job.json naming a model with remote code and trust_remote_code: verify neither
    imports that code nor loads that model; it recomputes with --model."""
    evil = tmp_path / "evil"
    shutil.copytree(tiny_bert, evil)
    marker = tmp_path / "ran"
    (evil / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel", "AutoConfig": "modeling_evil.EvilConfig"}
    (evil / "config.json").write_text(json.dumps(config))
    job = json.loads((output / "_job.json").read_text())
    job["options"].update(model=str(evil), trust_remote_code=True, allow_pickle=True)
    (output / "_job.json").write_text(json.dumps(job))
    result = verify(str(output), reference=Reference(4, str(tiny_bert)))
    assert result.ok, result.problems
    assert result.min_cos is not None and not marker.exists()


def test_doctored_job_options_are_problems(output):
    job = json.loads((output / "_job.json").read_text())
    job["options"]["output_dtype"] = "float16"
    (output / "_job.json").write_text(json.dumps(job))
    problems = verify(str(output)).problems
    assert problems and all("output_dtype=float32 but _job.json says float16" in p for p in problems)
    job["options"]["no_such_option"] = 1
    (output / "_job.json").write_text(json.dumps(job))
    assert verify(str(output)).problems[0].startswith("_job.json does not describe a valid job")


def test_dimension_mismatch_is_a_problem_not_a_crash():
    result = Verification()
    _compare(np.ones((3, 384), np.float32), np.ones((3, 128), np.float32), "float32", {}, result)
    assert result.problems == ["stored values have shape (384,), the reference (128,)"]
    result = Verification()
    _compare(np.ones((3, 48), np.uint8), np.ones((3, 128), np.float32), "ubinary", {}, result)
    assert result.problems == ["stored values have shape (48,), the reference (16,)"]


@pytest.mark.parametrize("output_dtype", ["float32", "int8", "binary"])
def test_sentence_transformers_pipeline_verifies_against_sentence_transformers(tiny_bert, tmp_path, output_dtype):
    """A Dense pipeline's output against SentenceTransformer.encode of the same directory."""
    import pyarrow as pa
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as m

    from jobs.spec import JobSpec

    torch.manual_seed(0)
    model = SentenceTransformer(modules=[m.Transformer(str(tiny_bert)), m.Pooling(32, "mean"), m.Dense(32, 16),
                                         m.Normalize()])
    model.save(str(tmp_path / "st"))
    texts = [f"the pooling job embeds row {i} " * (1 + i % 5) for i in range(30)]
    extra = {}
    if output_dtype == "int8":
        np.save(tmp_path / "calibration.npy", model.encode(texts[::3]))
        extra["calibration"] = str(tmp_path / "calibration.npy")
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    assert run_job(JobSpec(input=str(tmp_path / "in.parquet"), output=str(tmp_path / "out"), model=str(tmp_path / "st"),
                           backend="local", device="cpu", progress=False, output_dtype=output_dtype, **extra)).ok
    result = verify(str(tmp_path / "out"), reference=Reference(12, str(tmp_path / "st")))
    assert result.ok, result.problems
    assert (result.min_cos if output_dtype == "float32" else result.agreement) >= 0.999


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


def test_reference_rows_are_drawn_from_the_record_row_counts(tmp_path):
    """The sample is drawn before any shard is read, from the records alone, so verify
    keeps only the sampled rows' values: distinct rows, each inside its shard."""
    from jobs.manifest import Manifest
    from jobs.verify import Reference, _sample
    from workers.reader import Unit

    manifest = Manifest(str(tmp_path / "out"))
    manifest.prepare({"job": 1}, overwrite=False)
    rows = {"part-00000-00000": 5, "part-00000-00001": 0, "part-00001-00000": 3, "part-00002-00000": 4}
    for name, n in rows.items():
        manifest.commit({"name": name, "rows": n})
    manifest.finish({}, success=True)
    units = [Unit(name, "f", "parquet", 0, n) for name, n in rows.items() if name != "part-00002-00000"]
    picked = _sample(units, Manifest(str(tmp_path / "out")), Reference(rows=6, model="-"))
    pairs = [(name, i) for name, indices in picked.items() for i in indices]
    assert len(pairs) == len(set(pairs)) == 6 and all(0 <= i < rows[name] for name, i in pairs)
    assert "part-00002-00000" not in picked  # a record of no planned unit is never sampled
    assert sum(len(v) for v in _sample(units, Manifest(str(tmp_path / "out")), Reference(rows=50, model="-")).values()) == 8
