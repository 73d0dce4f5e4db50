"""A job over a directory mixing every kind of bad input: per case, the quarantine record
or the failure naming the file, and every good row exactly once with its clean embedding."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

from jobs.cli import main
from jobs.driver import run_job
from jobs.manifest import OutputConflictError
from jobs.spec import SpecError

GOOD = ["alpha beta", "", "gamma delta epsilon", "zeta"]


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    d = tmp_path_factory.mktemp("messy")
    pq.write_table(pa.table({"id": ["p0", "p1", "p2", "p3", "p4"], "text": [GOOD[0], None, GOOD[1], GOOD[2], GOOD[3]]}),
                   d / "a_good.parquet")
    pq.write_table(pa.table({"id": ["b0", "b1"], "text": pa.array([b"caf\xc3\xa9 au lait", b"\xff\xfe bad"], pa.binary())}),
                   d / "b_binary.parquet")
    pq.write_table(pa.table({"id": ["d0", "d1"], "text": pa.array(["zeta", "alpha beta"]).dictionary_encode()}),
                   d / "c_dict.parquet")
    (d / "d_lines.jsonl").write_text("\n".join(json.dumps({"id": f"j{i}", "text": t}) for i, t in
                                               enumerate(["gamma delta epsilon", None])) + "\n")
    pacsv.write_csv(pa.table({"id": ["c0"], "text": ["alpha beta"]}), d / "e_table.csv")
    feather.write_feather(pa.table({"id": ["f0"], "text": ["zeta"]}), d / "f_table.arrow")
    (d / "g_corrupt.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    whole = (d / "a_good.parquet").read_bytes()
    (d / "h_truncated.parquet").write_bytes(whole[: len(whole) // 2])
    pq.write_table(pa.table({"id": ["n0"], "body": ["no text column"]}), d / "i_nocol.parquet")
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), d / "j_empty.parquet")
    return d


@pytest.fixture(scope="module")
def messy_run(messy, make_spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("messy-out") / "out"
    return run_job(make_spec(out, input=str(messy), backend="local", max_retries=1)), out


def _clean_embeddings(make_spec, tmp_path, texts):
    src = tmp_path / "clean.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts}), src)
    assert run_job(make_spec(tmp_path / "clean", input=str(src), backend="local")).ok
    table = pq.read_table(tmp_path / "clean")
    return dict(zip(texts, np.stack(table.column("embedding").to_numpy(zero_copy_only=False))))


def test_bad_input_matrix(messy_run, make_spec, tmp_path):
    outcome, out = messy_run
    report = outcome.report
    failed = {f["file"].rsplit("/", 1)[1]: f["error"] for f in report["units_failed"]}
    assert set(failed) == {"g_corrupt.parquet", "h_truncated.parquet", "i_nocol.parquet"}
    assert "no column 'text'" in failed["i_nocol.parquet"] and "['id', 'body']" in failed["i_nocol.parquet"]
    assert all(name in error for name, error in failed.items())
    assert not outcome.ok and not (out / "_SUCCESS").exists()

    errors = pq.read_table(out / "_errors").to_pylist()
    reasons = {e["id"]: e["reason"] for e in errors}
    assert reasons["p1"] == "null text" and reasons["j1"] == "null text"
    assert reasons["b1"].startswith("invalid UTF-8")
    assert set(reasons) == {"p1", "j1", "b1"} and report["rows_quarantined"] == 3
    assert all(e["file"].endswith((".parquet", ".jsonl")) and e["row"] >= 0 for e in errors)

    table = pq.read_table(out, columns=["id", "embedding"])
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(["p0", "p2", "p3", "p4", "b0", "d0", "d1", "j0", "c0", "f0"])  # once each
    texts = {"p0": GOOD[0], "p2": "", "p3": GOOD[2], "p4": GOOD[3], "b0": "café au lait", "d0": "zeta",
             "d1": "alpha beta", "j0": "gamma delta epsilon", "c0": "alpha beta", "f0": "zeta"}
    clean = _clean_embeddings(make_spec, tmp_path, sorted(set(texts.values())))
    got = dict(zip(ids, np.stack(table.column("embedding").to_numpy(zero_copy_only=False))))
    for key, text in texts.items():
        np.testing.assert_allclose(got[key], clean[text], atol=1e-6, err_msg=key)


def test_cli_exit_code_and_summary_name_the_failed_files(messy_run, capsys):
    outcome, out = messy_run
    assert main("jobs.embed", "", ("embed",), _argv(outcome, out)) == 1  # resume: failed units rerun and fail again
    text = capsys.readouterr().out
    assert "FAILED" in text and "g_corrupt.parquet" in text and "3 quarantined" in text


def _argv(outcome, out):
    job = json.loads((out / "_job.json").read_text())
    o = job["options"]
    return ["--input", *job["input"], "--output", str(out), "--model", o["model"], "--id-column", "id",
            "--device", "cpu", "--backend", "local", "--unit-rows", str(o["unit_rows"]), "--max-retries", "1"]


def test_fail_policy_names_file_row_and_reason(messy, make_spec, tmp_path):
    src = tmp_path / "one.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": ["fine", None]}), src)
    outcome = run_job(make_spec(tmp_path / "o", input=str(src), backend="local", on_error="fail"))
    (error,) = outcome.failed.values()
    assert "RowError" in error and "one.parquet: row 1: null text" in error
    assert not list((tmp_path / "o").glob("data/part-*.parquet")) and not (tmp_path / "o" / "_errors").exists()


def test_non_text_column_fails_before_model_load(make_spec, tmp_path, monkeypatch):
    src = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"id": [1], "text": [42]}), src)
    import states.runtime

    monkeypatch.setattr(states.runtime.Runtime, "__init__", lambda *a: pytest.fail("model loaded"))
    argv = ["--input", str(src), "--output", str(tmp_path / "o"), "--model", make_spec(tmp_path).model,
            "--backend", "local", "--device", "cpu"]
    assert main("jobs.embed", "", ("embed",), argv) == 2


def test_existing_foreign_directory_refused(make_spec, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    with pytest.raises(OutputConflictError, match="not written by pooljobs"):
        run_job(make_spec(tmp_path / "o", backend="local"))


def test_unknown_option_and_bad_choice_name_the_key():
    from jobs.spec import JobSpec

    with pytest.raises(SpecError, match="pooling='avg'.*choose one of"):
        JobSpec(input="x", output="y", model="z", pooling="avg")
    with pytest.raises(SpecError, match="unknown key 'batch_size'"):
        JobSpec.from_mapping({"input": "x", "output": "y", "model": "z", "batch_size": 3})


def test_oom_splits_the_pack_and_output_is_unchanged(make_spec, tmp_path, monkeypatch):
    """An injected out-of-memory on big packs: the budget halves, packs split, same output."""
    from workers.unit import UnitRunner
    from states.runtime import Runtime

    spec = make_spec(tmp_path / "a", backend="local", max_tokens=4096)
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options))
    calls = {"oom": 0}
    compute = runner.runtime.launch

    def flaky(pack):
        if pack.num_seqs > 8:
            calls["oom"] += 1
            raise torch.OutOfMemoryError("injected")
        return compute(pack)

    from jobs.plan import list_inputs, plan_units

    unit = plan_units(spec, list_inputs(spec))[0]
    clean = runner.run(unit)
    clean_table = pq.read_table(tmp_path / "a" / "data" / f"{unit.name}.parquet")
    monkeypatch.setattr(runner.runtime, "launch", flaky)
    split = UnitRunner(spec.replace(output=str(tmp_path / "b")).unit_options, runner.runtime)  # its own shard
    result = split.run(unit)
    assert calls["oom"] > 0 and split.max_tokens < 4096
    assert result.rows == clean.rows and result.tokens == clean.tokens
    split_table = pq.read_table(tmp_path / "b" / "data" / f"{unit.name}.parquet")
    assert split_table.column("id").equals(clean_table.column("id"))
    # Smaller packs change CPU matmul blocking, so values agree to rounding, not bitwise.
    vectors = lambda t: np.stack(t.column("embedding").to_numpy(zero_copy_only=False))  # noqa: E731
    np.testing.assert_allclose(vectors(split_table), vectors(clean_table), atol=1e-6)


def test_disk_error_names_the_path_and_rerun_resumes(make_spec, tmp_path, monkeypatch):
    from workers.writer import AtomicFile

    spec = make_spec(tmp_path / "o", backend="local", max_retries=0)
    real_stream = AtomicFile.stream

    class FullDisk:
        closed = False

        def write(self, data):
            raise OSError(28, "No space left on device")

    def stream(atomic):  # the disk fills up under one shard's Parquet writer
        return pa.PythonFile(FullDisk(), mode="w") if "part-00000-00001" in atomic._path else real_stream.fget(atomic)

    monkeypatch.setattr(AtomicFile, "stream", property(stream))
    first = run_job(spec)
    assert list(first.failed) == ["part-00000-00001"]
    assert "part-00000-00001.parquet" in first.failed["part-00000-00001"] and "No space" in first.failed["part-00000-00001"]
    assert not (tmp_path / "o" / "_manifest" / "part-00000-00001.json").exists()
    assert not list((tmp_path / "o").glob(".*.tmp"))  # the failed shard's temp file is gone
    monkeypatch.setattr(AtomicFile, "stream", real_stream)
    second = run_job(spec)
    assert second.ok and second.report["units_run_now"] == 1


def test_input_values_never_become_paths(make_spec, tmp_path):
    src = tmp_path / "in" / "weird name #1.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"id": ["../../escape", "/etc/passwd"], "text": ["a", None]}), src)
    out = tmp_path / "o"
    assert run_job(make_spec(out, input=str(src.parent), backend="local")).ok
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and "in" not in p.parts)
    assert written == ["o/_SUCCESS", "o/_errors/part-00000-00000.parquet", "o/_job.json", "o/_manifest/part-00000-00000.json",
                       "o/_plan.json.zlib", "o/_report.json", "o/data/part-00000-00000.parquet"]


def test_remote_code_and_pickle_refused_by_default(make_spec, tiny_bert, tmp_path):
    import json as _json
    import shutil

    from states.loading import ModelLoadError

    # A known model type that also names custom code: the built-in class loads, the file never runs.
    remote = tmp_path / "remote"
    shutil.copytree(tiny_bert, remote)
    config = _json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}
    (remote / "config.json").write_text(_json.dumps(config))
    (remote / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    assert run_job(make_spec(tmp_path / "o1", model=str(remote), backend="local")).ok
    # An unknown model type that only custom code defines: refused, saying how to allow it.
    config["model_type"] = "evil-bert"
    (remote / "config.json").write_text(_json.dumps(config))
    with pytest.raises(ModelLoadError, match="trust.remote.code"):
        run_job(make_spec(tmp_path / "o3", model=str(remote), backend="local"))

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_bert, pickled)
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"not even read")
    with pytest.raises(ModelLoadError, match="allow-pickle"):
        run_job(make_spec(tmp_path / "o2", model=str(pickled), backend="local"))


def test_duplicate_ids_are_reported_and_kept(make_spec, tmp_path):
    from jobs.verify import verify

    src = tmp_path / "dups.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a", "a"], "text": ["one", "two", "three", "four"]}), src)
    outcome = run_job(make_spec(tmp_path / "o", input=str(src), backend="local"))
    assert outcome.ok and outcome.report["duplicate_ids_within_units"] == 2 and outcome.report["rows"] == 4
    assert pq.read_table(tmp_path / "o").column("id").to_pylist() == ["a", "b", "a", "a"]
    result = verify(str(tmp_path / "o"))
    assert result.ok and result.duplicate_ids == 2


def test_yaml_job_file_flags_override_and_bad_keys_named(make_spec, tmp_path, capsys):
    import yaml

    spec = make_spec(tmp_path / "unused")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"input": spec.input, "output": str(tmp_path / "o"), "model": spec.model,
                                   "id_column": "id", "device": "cpu", "backend": "local", "dim": 8, "unit_rows": 800}))
    assert main("jobs.embed", "", ("embed",), ["--config", str(job), "--dim", "16", "--no-progress"]) == 0
    assert pq.read_table(tmp_path / "o").schema.field("embedding").type.list_size == 16  # the flag won
    job.write_text(yaml.safe_dump({"input": "x", "output": "y", "model": "z", "batchsize": 3}))
    assert main("jobs.embed", "", ("embed",), ["--config", str(job)]) == 2
    assert "unknown key 'batchsize'" in capsys.readouterr().err
