"""The front door (issue 21): each mistake a new user made is one clear line and exit 2
before anything starts, with no traceback; `--help` and option errors answer without
importing torch; Ctrl-C, resume and completion say where the job stands; paths in
`_job.json` are absolute. CLI runs use `--backend local` and the tiny BERT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from jobs.cli import main, summarize
from jobs.driver import REPO_ROOT, run_job
from jobs.spec import JobSpec, SpecError
from tests.jobs.fixtures_models import write_corpus

EMBED = ("jobs.embed", "", ("embed",))
# Runs `python -m jobs.embed ARGS` and reports, at exit, whether torch was imported and
# the CPU seconds the module took (interpreter start excluded; CPU time, so that a test
# machine busy with other work does not make it look slow: importing torch alone takes
# several CPU seconds).
PROBE = """
import atexit, runpy, sys, time
start = time.process_time()
atexit.register(lambda: print(f"@@probe torch={'torch' in sys.modules} "
                              f"seconds={time.process_time() - start:.3f}", file=sys.stderr))
sys.argv = ["jobs.embed", *sys.argv[1:]]
runpy.run_module("jobs.embed", run_name="__main__")
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """2 Parquet files x 60 rows (`id`, `text`), row groups of 20: one unit (small files share one)."""
    return write_corpus(tmp_path_factory.mktemp("front-door") / "in", files=2, rows_per_file=60, row_group_size=20)


@pytest.fixture
def argv(corpus, tiny_bert):
    def make(output: Path, *extra: str) -> list[str]:
        return ["--input", str(corpus), "--output", str(output), "--model", str(tiny_bert), "--id-column", "id",
                "--backend", "local", "--device", "cpu", "--no-progress", *extra]

    return make


def probe(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    """(exit code, stdout, stderr without the probe line, torch imported, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)
    lines = done.stderr.splitlines()
    report = next(line for line in lines if line.startswith("@@probe"))
    fields = dict(item.split("=") for item in report.split()[1:])
    stderr = "\n".join(line for line in lines if not line.startswith("@@probe"))
    return done.returncode, done.stdout, stderr, fields["torch"] == "True", float(fields["seconds"])


def one_error_line(err: str) -> str:
    """The stderr of a refused job: exactly one `jobs.embed: error: ...` line, no traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("jobs.embed: error: "), err
    return lines[0]


# -- no torch before the options are valid ---------------------------------------------------
def test_help_imports_no_torch_and_answers_at_once():
    code, out, err, torch_loaded, seconds = probe("--help")
    assert code == 0 and not torch_loaded and seconds < 2.0, (seconds, err)
    for flag in ("--demo", "--dry-run", "--limit", "--version", "--debug", "--config"):
        assert flag in out


def test_version():
    code, out, _, torch_loaded, _ = probe("--version")
    assert code == 0 and out.startswith("jobs.embed (pooljobs ") and not torch_loaded


@pytest.mark.parametrize("content, key, words", [
    (None, "--config", "No such file"),
    ({"max_retries": "3"}, "max_retries='3'", "must be an integer"),
    ({"chunk_stride": "a"}, "chunk_stride='a'", "must be an integer"),
    ({"normalize": "false"}, "normalize='false'", "true or false"),
    ({"poolng": "mean"}, "unknown key 'poolng'", "did you mean 'pooling'"),
    ({"pooling": "maen"}, "pooling='maen' is not valid", "did you mean 'mean'"),
    ({"dim": 0}, "dim=0", "positive integer"),
    ("input: [unclosed", "not valid YAML", "line 1"),
])
def test_job_file_mistakes_are_one_line_before_torch(tmp_path, content, key, words):
    config = tmp_path / "job.yaml"
    if isinstance(content, dict):
        config.write_text(yaml.safe_dump({"input": "in", "output": "out", "model": "m", **content}))
    elif isinstance(content, str):
        config.write_text(content)
    code, _, err, torch_loaded, seconds = probe("--config", str(config))
    line = one_error_line(err)
    assert code == 2 and key in line and words in line, line
    assert not torch_loaded and seconds < 2.0


def test_no_arguments_say_what_is_required():
    code, _, err, torch_loaded, _ = probe()
    assert code == 2 and "input is required" in one_error_line(err) and not torch_loaded


def test_bad_flag_names_the_nearest_one():
    code, _, err, torch_loaded, _ = probe("--input", "x", "--ouptut", "y")
    line = one_error_line(err)
    assert code == 2 and "did you mean --output?" in line and not torch_loaded


def test_notebook_options_are_checked_the_same_way(tiny_bert):
    import jobs

    table = pa.table({"text": ["a"]})
    with pytest.raises(SpecError, match="normalize='false' .* true or false"):
        jobs.embed(table, model=str(tiny_bert), normalize="false", backend="local")
    with pytest.raises(SpecError, match="max_retries='3'"):
        JobSpec.from_mapping({"input": "x", "output": "y", "model": "z", "max_retries": "3"})


# -- checked before a worker starts, nothing claimed -------------------------------------------
def test_wrong_text_column_is_refused_before_the_model_and_claims_nothing(argv, tmp_path, capsys, monkeypatch):
    import states.runtime

    out = tmp_path / "o"
    monkeypatch.setattr(states.runtime.Runtime, "__init__", lambda *a: pytest.fail("model loaded"))
    t = time.perf_counter()
    assert main(*EMBED, argv(out, "--text-column", "txt")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "text_column='txt'" in line and "did you mean 'text'" in line and time.perf_counter() - t < 10
    assert not out.exists() or not any(out.iterdir())  # the corrected rerun needs no --overwrite
    monkeypatch.undo()
    assert main(*EMBED, argv(out)) == 0


def test_id_column_named_like_an_output_column_is_refused(argv, tmp_path, capsys):
    args = argv(tmp_path / "o")
    args[args.index("--id-column") + 1] = "embedding"
    assert main(*EMBED, args) == 2
    assert "id_column='embedding' is a column name the output itself uses" in one_error_line(capsys.readouterr().err)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("backend", ["local", "auto"])
def test_cuda_without_a_gpu_is_refused_without_starting_ray(argv, tmp_path, capsys, monkeypatch, backend):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = argv(tmp_path / "o", "--device", "cuda", "--backend", backend)
    t = time.perf_counter()
    assert main(*EMBED, args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "device='cuda'" in line and "no CUDA GPU" in line and "--device cpu" in line
    assert time.perf_counter() - t < 10 and not ray.is_initialized()


def test_cuda_on_a_ray_cluster_without_gpus_is_refused(argv, tmp_path, capsys):
    import ray

    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)
    capsys.readouterr()  # Ray's own start-up lines
    try:
        assert main(*EMBED, argv(tmp_path / "o", "--device", "cuda", "--backend", "ray")) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "device='cuda', but the Ray cluster has no GPU and no autoscaler" in line and "1 CPU" in line
    finally:
        ray.shutdown()


@pytest.mark.skipif(find_spec("states.preflight") is None, reason="states.preflight (the models layer) not present")
def test_dim_larger_than_the_model_is_refused(argv, tmp_path, capsys):
    assert main(*EMBED, argv(tmp_path / "o", "--dim", "1024")) == 2
    assert "dim" in one_error_line(capsys.readouterr().err)


def test_hub_id_is_not_refused_as_a_missing_directory_at_the_edge(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = JobSpec(input="in", output="out", model="BAAI/bge-small-en-v1.5")
    assert spec.model == "BAAI/bge-small-en-v1.5" and spec.input == str(tmp_path / "in")
    (tmp_path / "org" / "name").mkdir(parents=True)  # a local directory of that shape stays a path
    assert JobSpec(input="in", output="out", model="org/name").model == str(tmp_path / "org" / "name")


# -- paths ---------------------------------------------------------------------------------------
def test_job_records_absolute_paths_and_verify_works_from_elsewhere(corpus, tiny_bert, tmp_path, monkeypatch):
    from jobs.verify import verify

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "in").symlink_to(corpus)
    monkeypatch.chdir(tmp_path / "work")
    assert main(*EMBED, ["--input", "in", "--output", "out", "--model", str(tiny_bert), "--id-column", "id",
                         "--backend", "local", "--device", "cpu", "--no-progress"]) == 0
    job = json.loads((tmp_path / "work" / "out" / "_job.json").read_text())
    assert job["input"] == [str(tmp_path / "work" / "in")]
    monkeypatch.chdir(tmp_path)
    assert verify("work/out").ok


def test_relative_output_under_ray_job_submit_is_refused(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}, "metadata": {}}))
    monkeypatch.chdir(tmp_path)
    assert main(*EMBED, argv(Path("out/x"))) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "output='out/x' is relative" in line and "ray job submit" in line and "absolute" in line
    assert not (tmp_path / "out").exists()


# -- where a job stands ------------------------------------------------------------------------
def test_dry_run_describes_and_writes_nothing(argv, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(*EMBED, [*argv(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "2 input files, 1 unit ->" in text and "rows: 120" in text and "tokens: ~" in text
    assert "id: int64" in text and "embedding: fixed_size_list<item: float not null>[32]" in text
    assert "pooling=cls" in text and "max_length=128" in text
    assert not out.exists()


def test_demo_arguments_come_before_the_others(argv, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(*EMBED, ["--demo", "--dry-run"], demo=lambda: argv(out)) == 0
    assert f"1 unit -> {out}" in capsys.readouterr().out and not out.exists()


def test_limit_runs_the_first_units_only(argv, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(*EMBED, argv(out, "--limit", "30")) == 0
    assert pq.read_table(out).column("id").to_pylist() == list(range(40))  # the first two 20-row row groups


def test_interrupt_says_how_far_and_the_rerun_resumes(tiny_bert, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "in", files=1, rows_per_file=800, row_group_size=100)
    out = tmp_path / "o"
    args = ["--input", str(corpus), "--output", str(out), "--model", str(tiny_bert), "--id-column", "id",
            "--backend", "local", "--device", "cpu", "--no-progress", "--unit-rows", "100"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jobs.embed", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("_manifest/*.json")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    done = len(list(out.glob("_manifest/*.json")))
    assert f"jobs.embed: interrupted: {done} of 8 units committed; rerun the same command to resume" in err
    assert done < 8

    assert main(*EMBED, args) == 0
    assert f"jobs.embed: resuming: {done} of 8 units committed" in capsys.readouterr().out
    assert main(*EMBED, args) == 0
    assert "already complete: all 8 units" in capsys.readouterr().out


def test_summary_shows_the_startup_timeline(argv, tmp_path):
    spec_args = argv(tmp_path / "o")
    outcome = run_job(JobSpec(input=spec_args[1], output=str(tmp_path / "o"), model=spec_args[5], id_column="id",
                              backend="local", device="cpu", progress=False))
    outcome.report.pop("startup", None)  # the driver's own timeline, when it records one
    assert not any(line.startswith("pooljobs: startup") for line in summarize(outcome).splitlines())
    outcome.report["startup"] = {"imports": 1.24, "model_read": 0.5}
    assert "pooljobs: startup imports 1.2s, model_read 0.5s" in summarize(outcome).splitlines()
