"""Jobs on object storage over the real S3 protocol: moto's S3 server on loopback, spoken
to by pyarrow's S3 client (the AWS C++ SDK) from this process and from a CLI subprocess.

Each S3 output is compared with a local-disk run of the same job; the resume test drops
one commit record and the success marker, as a driver killed mid-job would leave them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import threading

import pyarrow.fs as pafs
import pytest

from jobs.cli import main as cli_main
from jobs.driver import REPO_ROOT, run_job
from jobs.manifest import Manifest
from jobs.plan import list_inputs, plan_units, save_plan, saved_or_planned
from jobs.spec import JobSpec
from tests.jobs.fixtures_models import read_shard_table, save_tiny_bert, write_corpus

BUCKET = "pooljobs-test"
SHARDS = [f"part-0000{f}-0000{u}" for f in (0, 1) for u in (0, 1)]  # 2 files x 60 rows, in units of 40 rows


def _fix_complete_multipart(app):
    """moto 5.2.1 answers CompleteMultipartUpload with the root element
    <CompleteMultipartUploadResponse> (getmoto/moto#10055); S3 sends
    <CompleteMultipartUploadResult>, and Arrow's S3 client takes any other root for an
    error embedded in a 200 OK, so every upload fails. Renaming it here keeps pyarrow's
    default upload path (multipart, committed on close), the one real S3 gets, under test."""

    def fixed(environ, start_response):
        if environ["REQUEST_METHOD"] != "POST" or "uploadId=" not in environ.get("QUERY_STRING", ""):
            return app(environ, start_response)
        captured = []
        body = b"".join(app(environ, lambda status, headers, exc_info=None: captured.append((status, headers))))
        body = body.replace(b"CompleteMultipartUploadResponse", b"CompleteMultipartUploadResult")
        status, headers = captured[0]
        start_response(status, [(k, str(len(body)) if k.lower() == "content-length" else v) for k, v in headers])
        return [body]

    return fixed


class MotoS3:
    """moto's S3 on a free loopback port: ThreadedMotoServer's app and werkzeug server,
    built here because the app needs the wrapper above (ThreadedMotoServer takes none)."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app = _fix_complete_multipart(DomainDispatcherApplication(create_backend_app))
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.thread = threading.Thread(target=self.server.serve_forever, name="moto-s3", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> MotoS3:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.thread.join()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(save_tiny_bert(tmp_path_factory.mktemp("s3-model")))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("s3-corpus"))


@pytest.fixture(scope="module")
def s3(corpus):
    """(storage_options, filesystem) for a fresh S3 server whose bucket holds the corpus under in/."""
    with MotoS3() as server:
        options = {"endpoint_override": server.endpoint, "scheme": "http", "access_key": "x", "secret_key": "x",
                   "region": "us-east-1"}
        pafs.S3FileSystem(**options, allow_bucket_creation=True).create_dir(BUCKET)
        fs = pafs.S3FileSystem(**options)
        for file in sorted(corpus.iterdir()):
            with fs.open_output_stream(f"{BUCKET}/in/{file.name}") as out:
                out.write(file.read_bytes())
        yield options, fs


def spec(model: str, input: str, output: str, storage_options: dict | None = None) -> JobSpec:
    return JobSpec(input=input, output=output, model=model, storage_options=storage_options or {}, backend="local",
                   device="cpu", id_column="id", unit_rows=40, progress=False)


@pytest.fixture(scope="module")
def local_shards(model, corpus, tmp_path_factory):
    """The same job's shards written to local disk: what every S3 run must reproduce."""
    out = tmp_path_factory.mktemp("s3-local") / "out"
    outcome = run_job(spec(model, str(corpus), str(out)))
    assert outcome.ok, outcome.failed
    table = read_shard_table(pafs.LocalFileSystem(), str(out))
    assert table["id"].to_pylist() == list(range(120))
    return table


def names(fs: pafs.FileSystem, prefix: str) -> set[str]:
    infos = fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
    return {i.path.removeprefix(prefix + "/") for i in infos if i.is_file}


def test_s3_job_commits_the_same_shards_as_local_disk(s3, model, local_shards):
    options, fs = s3
    outcome = run_job(spec(model, f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out/", options))
    assert outcome.ok, outcome.failed
    assert outcome.report["units_committed"] == outcome.report["units_run_now"] == len(SHARDS)

    expected = {"_SUCCESS", "_job.json", "_plan.json.zlib", "_report.json", *(f"data/{n}.parquet" for n in SHARDS),
                *(f"_manifest/{n}.json" for n in SHARDS)}
    assert names(fs, f"{BUCKET}/out") == expected
    records = Manifest(f"s3://{BUCKET}/out/", options).committed()
    for name, record in records.items():  # the recorded checksum is of exactly the bytes stored
        with fs.open_input_stream(f"{BUCKET}/out/data/{name}.parquet") as f:
            data = f.read()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (record["bytes"], record["checksum"])
    assert read_shard_table(fs, f"{BUCKET}/out").equals(local_shards)


def test_s3_resume_redoes_only_the_uncommitted_unit(s3, model, local_shards):
    options, fs = s3
    job = spec(model, f"s3://{BUCKET}/in/", f"s3://{BUCKET}/resume/", options)
    assert run_job(job).ok
    before = Manifest(job.output, options).committed()

    lost = SHARDS[2]  # a crash after the shard's put but before its commit record
    fs.delete_file(f"{BUCKET}/resume/_manifest/{lost}.json")
    fs.delete_file(f"{BUCKET}/resume/_SUCCESS")
    outcome = run_job(job)

    assert outcome.ok, outcome.failed
    assert (outcome.report["units_run_now"], outcome.report["units_committed"]) == (1, len(SHARDS))
    after = Manifest(job.output, options).committed()
    assert {n: r for n, r in after.items() if n != lost} == {n: r for n, r in before.items() if n != lost}
    assert after[lost]["checksum"] == before[lost]["checksum"]  # redone to the same bytes
    assert fs.get_file_info(f"{BUCKET}/resume/_SUCCESS").is_file
    assert read_shard_table(fs, f"{BUCKET}/resume").equals(local_shards)


def test_cli_storage_option_flags(s3, model, local_shards):
    """A separate process reaches the server only through --storage-option flags; the
    typed `allow_delayed_open=true` (YAML-parsed to a bool) switches pyarrow to one
    PutObject per small file, the other upload path."""
    options, fs = s3
    flags = [arg for k, v in {**options, "allow_delayed_open": "true"}.items()
             for arg in ("--storage-option", f"{k}={v}")]
    cmd = [sys.executable, "-m", "jobs.embed", "--input", f"s3://{BUCKET}/in/", "--output", f"s3://{BUCKET}/cli/",
           "--model", model, "--device", "cpu", "--backend", "local", "--id-column", "id", "--unit-rows", "40",
           "--no-progress", *flags]
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(SHARDS)}/{len(SHARDS)} units, 120 rows" in proc.stdout
    assert fs.get_file_info(f"{BUCKET}/cli/_SUCCESS").is_file
    assert read_shard_table(fs, f"{BUCKET}/cli").equals(local_shards)


@pytest.mark.parametrize("via", ["storage_options", "environment"])
def test_keys_that_need_escaping_in_a_uri(s3, model, local_shards, via, monkeypatch):
    """A listed key with a space and a "#" becomes a unit URI that resolves back to it,
    both with storage options (S3FileSystem) and without, where pyarrow's from_uri reads
    the endpoint and credentials from the environment, as on AWS with an instance role."""
    options, fs = s3
    prefix = f"odd-{via}"
    with fs.open_input_stream(f"{BUCKET}/in/part-0.parquet") as f:
        data = f.read()
    with fs.open_output_stream(f"{BUCKET}/{prefix}/Q1 2025/part #1.parquet") as out:
        out.write(data)
    if via == "environment":
        for key, value in {"AWS_ENDPOINT_URL": options["endpoint_override"], "AWS_ACCESS_KEY_ID": "x",
                           "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_EC2_METADATA_DISABLED": "true"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
    outcome = run_job(spec(model, f"s3://{BUCKET}/{prefix}/", f"s3://{BUCKET}/{prefix}-out/",
                           options if via == "storage_options" else None))
    assert outcome.ok, outcome.failed
    assert read_shard_table(fs, f"{BUCKET}/{prefix}-out").equals(local_shards.slice(0, 60))  # part-0's rows


@pytest.mark.parametrize("uri", [f"s3://{BUCKET}/missing/", "s3://pooljobs-no-such-bucket/in/"])
def test_cli_missing_s3_input_is_a_user_error(s3, model, uri, capsys):
    options, _ = s3
    flags = [arg for k, v in options.items() for arg in ("--storage-option", f"{k}={v}")]
    argv = ["--input", uri, "--output", f"s3://{BUCKET}/never/", "--model", model, "--backend", "local", *flags]
    assert cli_main("jobs.embed", "test", ("embed",), argv) == 2
    assert "does not exist" in capsys.readouterr().err


def test_planning_reads_each_footer_in_one_request_and_a_resume_none(s3, caplog):
    """A footer is one ranged GET (the listing's size spares the HEAD); with the plan saved
    in the output, planning again over the same listing reads no input object at all."""
    options, _ = s3
    job = JobSpec(input=f"s3://{BUCKET}/in/", output=f"s3://{BUCKET}/plan-out/", model="-", id_column="id",
                  unit_rows=40, storage_options=options)

    def object_requests() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug" and f"/{BUCKET}/in/" in r.getMessage()]
        caplog.clear()
        return [re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) /', line).group(1) for line in lines]

    with caplog.at_level(logging.INFO, logger="werkzeug"):
        files = list_inputs(job)
        caplog.clear()
        units = plan_units(job, files)
        assert object_requests() == ["GET"] * len(files) == ["GET", "GET"]
        manifest = Manifest(job.output, options)
        manifest.prepare({"job": "plan"}, overwrite=False)
        save_plan(manifest, job, files, units)
        manifest.close()
        caplog.clear()
        assert saved_or_planned(job, files, Manifest(job.output, options)) == (units, True)
        assert object_requests() == []


def test_a_commit_is_one_put_through_one_client(s3, caplog):
    options, _ = s3
    manifest = Manifest(f"s3://{BUCKET}/commits/", options)
    manifest.prepare({"job": "commits"}, overwrite=False)
    with caplog.at_level(logging.INFO, logger="werkzeug"):
        caplog.clear()
        for i in range(20):
            manifest.commit({"name": f"part-{i:05d}-00000", "rows": 1})
        manifest.flush()
        lines = [r.getMessage() for r in caplog.records if r.name == "werkzeug"]
    manifest.close()
    assert len(lines) == 20 and all(re.search(r'"(?:\x1b\[[0-9;]*m)*PUT /[^ ]*/_manifest/part-', line) for line in lines)
    assert len(Manifest(f"s3://{BUCKET}/commits/", options).committed_names()) == 20
