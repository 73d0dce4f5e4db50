"""Jobs over JSONL/CSV with bad lines: every good line embedded exactly once, each bad
line quarantined with its line number; `on_error=fail` names the file and line;
zero-byte files are zero-row files."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs.driver import run_job

TEXTS = ["alpha beta", "gamma", "delta epsilon zeta", "eta", "theta iota", "kappa"]


def _embedded(out) -> dict:
    table = pq.read_table(out, columns=["id", "embedding"])
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a row written twice"
    return dict(zip(ids, np.stack(table.column("embedding").to_numpy(zero_copy_only=False))))


def test_jsonl_and_csv_bad_lines_lose_only_themselves(make_spec, single_thread, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    lines = [json.dumps({"id": i, "text": t, "extra": i if i % 2 else "s"}) for i, t in enumerate(TEXTS)]
    lines[2] = '{"id": 2, "text": "broken'  # line 3
    lines.insert(4, json.dumps({"id": "four", "text": "x"}))  # line 5: an id of another type than the first file's
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    (src / "b.csv").write_text("id,text\n100,12345\n101,alpha beta\n102\n103,gamma\n")  # line 4: one field
    (src / "c.jsonl").write_bytes(b"")
    (src / "d.csv").write_bytes(b"")
    outcome = run_job(make_spec(tmp_path / "out", input=str(src), backend="local", unit_rows=10))
    assert outcome.ok, outcome.failed
    assert outcome.report["units"] == 2  # zero-byte files plan no unit

    got = _embedded(tmp_path / "out")
    assert sorted(got) == [0, 1, 3, 4, 5, 100, 101, 103]
    errors = pq.read_table(tmp_path / "out" / "_errors").to_pylist()
    by_file = {(e["file"].rsplit("/", 1)[1], e["row"]): (e["id"], e["reason"]) for e in errors}
    assert set(by_file) == {("a.jsonl", 2), ("a.jsonl", 4), ("b.csv", 2)}
    assert by_file[("a.jsonl", 2)][1].startswith("line 3: invalid JSON") and by_file[("a.jsonl", 2)][0] is None
    assert by_file[("a.jsonl", 4)] == (None, "line 5: 'id' value 'four' is not int64")
    assert by_file[("b.csv", 2)] == (102, "line 4: 1 fields, the header has 2")  # its id is kept
    assert outcome.report["rows_quarantined"] == 3

    same = _embedded_texts(make_spec, tmp_path, ["12345", "alpha beta"])
    np.testing.assert_allclose(got[100], same["12345"], atol=1e-6)
    np.testing.assert_allclose(got[101], got[0], atol=1e-6)  # the same text from JSONL and CSV


def _embedded_texts(make_spec, tmp_path, texts):
    src = tmp_path / "clean.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), src)
    assert run_job(make_spec(tmp_path / "clean", input=str(src), backend="local")).ok
    return dict(zip(texts, _embedded(tmp_path / "clean").values()))


def test_fail_policy_names_the_file_and_line(make_spec, single_thread, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 0, "text": "fine"}\n\n{"id": 1, "text": \n')
    outcome = run_job(make_spec(tmp_path / "o", input=str(src), backend="local", on_error="fail"))
    (error,) = outcome.failed.values()
    assert f"{src}: row 1: line 3: invalid JSON" in error
