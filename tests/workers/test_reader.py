"""JSONL and CSV read as the user meant: an explicit schema (text as strings, the id as
typed), one quarantined row per bad line naming the line, every good line kept."""

import json

import pyarrow as pa
import pytest

from workers.reader import READ_ERROR, InputError, Unit, read_unit, text_column

SCHEMA = pa.schema([("text", pa.string()), ("id", pa.int64())])


def _read(path, fmt, schema=SCHEMA, columns=("text", "id")):
    return read_unit(Unit("u", str(path), fmt, 0, -1, schema=schema), list(columns))


def test_jsonl_bad_lines_are_rows_with_their_line_number(tmp_path):
    lines = [json.dumps({"id": 1, "text": "one", "other": [1]}), "", "{not json", json.dumps({"id": 3, "text": {"a": 1}}),
             json.dumps({"id": "x", "text": "four"}), "[1, 2]", json.dumps({"id": 6, "text": "six", "other": "s"}),
             json.dumps({"id": 7, "text": 7})]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    table = _read(path, "jsonl")
    assert table.column_names == ["text", "id", READ_ERROR] and table.schema.field("id").type == pa.int64()
    texts, reasons = text_column(table, "text", str(path))
    assert texts == ["one", None, None, None, None, "six", "7"]  # a number named as text is its JSON text
    assert reasons[0] is None and reasons[5] is None and reasons[6] is None
    assert reasons[1].startswith("line 3: invalid JSON")  # the blank line 2 is no row, as in Arrow's reader
    assert reasons[2] == "line 4: 'text' is a JSON dict, not a string"
    assert reasons[3] == "line 5: 'id' value 'x' is not int64"
    assert reasons[4] == "line 6: invalid JSON (a JSON list, not an object)"
    assert table.column("id").to_pylist() == [1, None, 3, None, None, 6, 7]  # ids kept where they parse


def test_jsonl_id_changing_type_reads_every_line_as_string_ids(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": i if i < 3 else f"s{i}", "text": f"t{i}"}) for i in range(5)))
    table = _read(path, "jsonl", schema=pa.schema([("text", pa.string()), ("id", pa.string())]))
    assert table.column("id").to_pylist() == ["0", "1", "2", "s3", "s4"]
    assert text_column(table, "text", str(path)) == ([f"t{i}" for i in range(5)], [None] * 5)


def test_clean_files_take_arrows_reader_and_other_columns_are_not_read(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "text": f"t{i}", "x": [i] if i % 2 else "s"}) for i in range(4)))
    table = _read(path, "jsonl")
    assert table.column_names == ["text", "id", READ_ERROR] and table.column(READ_ERROR).null_count == 4
    assert table.column("id").to_pylist() == [0, 1, 2, 3]


def test_csv_digit_texts_are_strings_and_bad_records_quarantined(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b'id,text,flag\n1,0042,true\n\n2,"multi\nline",false\nq,ok,true\n4,short\n5,\xff\xfe,true\n6,7.5,x\n')
    table = _read(path, "csv")
    texts, reasons = text_column(table, "text", str(path))
    assert texts == ["0042", "multi\nline", None, None, None, "7.5"]
    assert reasons[:2] == [None, None] and reasons[5] is None
    assert reasons[2] == "line 6: 'id' value 'q' is not int64"
    assert reasons[3] == "line 7: 2 fields, the header has 3"
    assert reasons[4] == "line 8: 'text' is not valid UTF-8"
    assert table.column("id").to_pylist() == [1, 2, None, 4, 5, 6]


def test_clean_csv_of_digits_only(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text\n1,123\n2,2024-01-01\n3,true\n")
    table = _read(path, "csv")
    assert table.column(READ_ERROR).null_count == 3
    assert table.column("text").to_pylist() == ["123", "2024-01-01", "true"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_zero_byte_file_is_zero_rows(tmp_path, fmt):
    path = tmp_path / f"empty.{fmt}"
    path.write_bytes(b"")
    table = _read(path, fmt)
    assert table.num_rows == 0 and table.schema == pa.schema([*SCHEMA, pa.field(READ_ERROR, pa.string())])


@pytest.mark.parametrize("fmt, data", [("jsonl", '{"id": 1, "body": "x"}\n'), ("csv", "id,body\n1,x\n"),
                                       ("csv", "id,body\n1,x\n2\n")])
def test_missing_text_column_names_the_file_and_its_columns(tmp_path, fmt, data):
    path = tmp_path / f"in.{fmt}"
    path.write_text(data)
    with pytest.raises(InputError, match=r"no column 'text'; the file has columns \['id', 'body'\]"):
        _read(path, fmt)
