"""Organization data files: JSONL/parquet rows to task items, with line-numbered errors."""

from __future__ import annotations

import json
import logging

import pytest

from pubswap_flwr.tasks import TaskError, TaskItem, load_items


def write_jsonl(path, rows) -> None:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_good_rows_become_task_items(tmp_path):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [
        {"question": "2+2?", "answer": "4"},
        {"question": "Capital of France?", "answer": " Paris ", "verifier": "exact", "task": "geo"},
        {"question": "Half of 3?", "answer": 1.5, "verifier": "numeric", "metadata": {"tolerance": 0.01},
         "family": "math"},
        {"question": "Seven?", "answer": 7, "metadata": '{"task": "counting"}'},
    ])
    items = load_items(path)
    assert [i.uid for i in items] == ["org/1", "org/2", "org/3", "org/4"]
    first = items[0]
    assert first == TaskItem("org/1", "org", "2+2?", "4", "exact")
    assert first.provenance == {"row": 1, "file": "org.jsonl"} and first.family == "plain"
    assert (items[1].task, items[1].answer, items[1].verifier) == ("geo", "Paris", "exact")
    assert (items[2].verifier, items[2].answer, items[2].metadata, items[2].family) == (
        "numeric", "1.5", {"tolerance": 0.01}, "math")
    assert (items[3].answer, items[3].task, items[3].metadata) == ("7", "counting", {"task": "counting"})


def test_default_verifier_and_uid_prefix(tmp_path):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "q", "answer": "1"}, {"question": "r", "answer": "2", "verifier": "exact"}])
    items = load_items(path, default_verifier="numeric", uid_prefix="node3")
    assert [(i.uid, i.verifier) for i in items] == [("node3/1", "numeric"), ("node3/2", "exact")]


def test_blank_lines_are_skipped_but_line_numbers_kept(tmp_path):
    path = tmp_path / "org.jsonl"
    path.write_text('\n{"question": "q", "answer": "a"}\n\n   \n{"question": "r", "answer": "b"}\n')
    items = load_items(path)
    assert [(i.uid, i.provenance["row"]) for i in items] == [("org/2", 2), ("org/5", 5)]


BAD_ROWS = [
    ('{"question": "q", "answer": ', "line 2: not valid JSON"),
    ('["a", "list"]', "line 2: not a JSON object"),
    ({"answer": "4"}, "row 2: object missing required field `question`"),
    ({"question": "   ", "answer": "4"}, "row 2: missing or empty 'question'"),
    ({"question": "q"}, "row 2: object missing required field `answer`"),
    ({"question": "q", "answer": ""}, "row 2: missing or empty 'answer'"),
    ({"question": "q", "answer": ["4"]}, "row 2: answer: expected `int | float | str`, got `array`"),
    ({"question": "q", "answer": "4", "verifier": "judge"}, "row 2: row 2: unknown verifier 'judge'"),
    ({"question": "q", "answer": "4", "verifier": 3}, "row 2: verifier: expected `str | null`, got `int`"),
    ({"question": "q", "answer": "4", "metadata": "{oops"}, "row 2: 'metadata' is not a JSON object"),
    ({"question": "q", "answer": "4", "metadata": "[1]"}, "row 2: 'metadata' must be an object"),
    ({"question": "q", "answer": "4", "metadata": {"task": 7}}, "row 2: metadata's 'task' must be text, got int"),
    ({"question": "q", "answer": "4", "metadata": [1]}, "row 2: metadata: expected `str | object | null`, got `array`"),
    ('{"question": "q", "answer": true}', "row 2: answer: expected `int | float | str`, got `bool`"),
    ('{"question": "q", "answer": false}', "row 2: answer: expected `int | float | str`, got `bool`"),
    ('{"question": "q", "answer": NaN}', "row 2: 'answer' must be a finite number, got nan"),
    ('{"question": "q", "answer": Infinity}', "row 2: 'answer' must be a finite number, got inf"),
    ('{"question": "q", "answer": -Infinity}', "row 2: 'answer' must be a finite number, got -inf"),
    ({"question": "q", "answer": "4", "task": {"name": "x"}}, "row 2: task: expected `str | null`, got `object`"),
    ({"question": "q", "answer": "4", "family": ["math"]}, "row 2: family: expected `str | null`, got `array`"),
    ('{"question": "q", "answer": ' + "1" * 5000 + "}", "line 2: not valid JSON (Exceeds the limit"),
    ('{"question": "q", "answer": "4", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "line 2: nested more than 16 levels deep"),
    ('{"question": "q", "answer": "4", "metadata": ' + "[" * 17 + "]" * 17 + "}",
     "line 2: row is nested more than 16 levels deep"),
    ({"question": "q", "answer": "4", "metadata": json.dumps({"a": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]})},
     "row 2: 'metadata' is nested more than 16 levels deep"),
    ({"question": "q", "answer": "4", "metadata": "[" * 100_000 + "]" * 100_000},
     "row 2: 'metadata' is nested more than 16 levels deep"),
]


@pytest.mark.parametrize("bad,message", BAD_ROWS, ids=[m[:60] for _b, m in BAD_ROWS])
def test_bad_row_is_an_error_naming_its_number(tmp_path, bad, message):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "ok", "answer": "1"}, bad, {"question": "ok too", "answer": "2"}])
    with pytest.raises(TaskError) as info:
        load_items(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 1 malformed row(s): ")
    assert message in text


@pytest.mark.parametrize("bad,message", BAD_ROWS, ids=[m[:60] for _b, m in BAD_ROWS])
def test_bad_row_is_skipped_and_logged_with_skip(tmp_path, caplog, bad, message):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "ok", "answer": "1"}, bad, {"question": "ok too", "answer": "2"}])
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr.tasks.files"):
        items = load_items(path, on_bad_row="skip")
    assert [i.uid for i in items] == ["org/1", "org/3"]
    assert any(message in record.getMessage() and "skipped" in record.getMessage() for record in caplog.records)


def test_answers_keep_their_exact_text_and_metadata_may_nest_to_the_limit(tmp_path):
    path = tmp_path / "org.jsonl"
    deep = {"a": [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}  # 16 levels below the row, counting 'metadata' itself
    path.write_text('{"question": "q", "answer": 12345678901234567890123}\n'
                    '{"question": "r", "answer": 0.1}\n'
                    + json.dumps({"question": "s", "answer": -3, "metadata": deep}) + "\n"
                    + json.dumps({"question": "t", "answer": "x", "metadata": json.dumps(deep)}) + "\n")
    items = load_items(path)
    assert [i.answer for i in items] == ["12345678901234567890123", "0.1", "-3", "x"]
    assert items[2].metadata == deep and items[3].metadata == deep


def test_a_line_that_is_not_utf8_is_reported_with_its_number(tmp_path):
    path = tmp_path / "org.jsonl"
    path.write_bytes(b'{"question": "ok", "answer": "1"}\n'
                     b'{"question": "caf\xe9", "answer": "2"}\n'
                     b'{"question": "ok too", "answer": "3"}\n')
    with pytest.raises(TaskError) as info:
        load_items(path)
    assert str(info.value) == (f"{path}: 1 malformed row(s): line 2: not UTF-8 text (invalid continuation byte: "
                               "byte 0xe9 at byte 18 of the line)")
    assert [i.answer for i in load_items(path, on_bad_row="skip")] == ["1", "3"]


def test_a_byte_order_mark_and_crlf_line_ends_are_read(tmp_path):
    path = tmp_path / "org.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "q", "answer": "1"}\r\n{"question": "\xc3\xa9", "answer": "2"}\r\n')
    assert [(i.question, i.answer) for i in load_items(path)] == [("q", "1"), ("\u00e9", "2")]


def test_an_overlong_line_is_reported_and_the_next_lines_still_read(tmp_path, monkeypatch):
    from pubswap_flwr.tasks import files

    monkeypatch.setattr(files, "MAX_ROW_BYTES", 64)
    path = tmp_path / "org.jsonl"
    long_row = json.dumps({"question": "x" * 3_000_000, "answer": "2"})
    path.write_text('{"question": "q", "answer": "1"}\n' + long_row + '\n{"question": "r", "answer": "3"}\n')
    with pytest.raises(TaskError, match=r"1 malformed row\(s\): line 2: longer than 64 bytes$"):
        load_items(path)
    items = load_items(path, on_bad_row="skip")
    assert [(i.uid, i.answer) for i in items] == [("org/1", "1"), ("org/3", "3")]


@pytest.mark.parametrize("content", [b"", b"garbage", b"PAR1" + b"\x00" * 64 + b"PAR1", b'{"question": "q"}'])
def test_a_file_that_is_not_parquet_is_an_error_naming_it(tmp_path, content):
    pytest.importorskip("datasets")
    path = tmp_path / "org.parquet"
    path.write_bytes(content)
    with pytest.raises(TaskError) as info:
        load_items(path)
    assert str(info.value).startswith(f"{path}: not a readable parquet file (")


def test_error_lists_several_bad_rows_and_counts_the_rest(tmp_path):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "ok", "answer": "1"}] + ["not json"] * 7)
    with pytest.raises(TaskError) as info:
        load_items(path)
    text = str(info.value)
    assert "7 malformed row(s)" in text
    for line in range(2, 7):
        assert f"line {line}: not valid JSON" in text
    assert "line 7" not in text and "and 2 more" in text


def test_only_bad_rows_with_skip_is_an_error(tmp_path):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "q"}])
    with pytest.raises(TaskError, match="no usable rows"):
        load_items(path, on_bad_row="skip")


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(TaskError, match="no usable rows"):
        load_items(path)


def test_parquet_loads(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "org.parquet"
    datasets.Dataset.from_list([
        {"question": "2+2?", "answer": "4", "verifier": "numeric"},
        {"question": "Capital of Italy?", "answer": "Rome", "verifier": None},
    ]).to_parquet(str(path))
    items = load_items(path)
    assert [(i.uid, i.question, i.answer, i.verifier) for i in items] == [
        ("org/1", "2+2?", "4", "numeric"), ("org/2", "Capital of Italy?", "Rome", "exact")]
    assert items[0].provenance == {"row": 1, "file": "org.parquet"}


def test_parquet_bad_row_names_row_number(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "org.parquet"
    datasets.Dataset.from_list([{"question": "q", "answer": "1"}, {"question": "r", "answer": None}]).to_parquet(
        str(path))
    with pytest.raises(TaskError, match=r"row 2: answer: expected `int \| float \| str`, got `null`"):
        load_items(path)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "org.csv"
    path.write_text("question,answer\nq,a\n")
    with pytest.raises(TaskError, match=r"unsupported data file type '.csv'; use .jsonl or .parquet"):
        load_items(path)


def test_missing_file(tmp_path):
    with pytest.raises(TaskError, match="data file not found"):
        load_items(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="data file not found"):
        load_items(tmp_path)  # a directory is not a data file


@pytest.mark.parametrize("kwargs,match", [
    ({"fmt": "alpaca"}, "unknown data format 'alpaca'; known: .*generic"),
    ({"on_bad_row": "ignore"}, "on_bad_row must be 'error' or 'skip'"),
    ({"default_verifier": "judge"}, "default verifier: unknown verifier 'judge'"),
])
def test_bad_options(tmp_path, kwargs, match):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "q", "answer": "a"}])
    with pytest.raises(TaskError, match=match):
        load_items(path, **kwargs)


ITEM = {"uid": "peer/1", "task": "gcd", "question": "gcd(4, 6)?", "answer": "2", "verifier": "exact",
        "metadata": {"k": 1}, "provenance": {"row": 1}, "family": "plain"}


def test_task_item_from_dict_round_trips_and_fills_absent_optional_fields():
    item = TaskItem.from_dict(ITEM)
    assert TaskItem.from_dict(item.to_dict()) == item and item.metadata == {"k": 1}
    bare = TaskItem.from_dict({k: ITEM[k] for k in ("uid", "task", "question", "verifier")})
    assert (bare.answer, bare.metadata, bare.provenance, bare.family) == (None, {}, {}, "plain")


@pytest.mark.parametrize("changes, message", [
    ({"question": {"text": "q"}}, "task item.question: expected `str`, got `object`"),
    ({"uid": 7}, "task item.uid: expected `str`, got `int`"),
    ({"task": ["gcd"]}, "task item.task: expected `str`, got `array`"),
    ({"verifier": None}, "task item.verifier: expected `str`, got `null`"),
    ({"answer": 2}, "task item.answer: expected `str | null`, got `int`"),
    ({"answer": True}, "task item.answer: expected `str | null`, got `bool`"),
    ({"family": {"f": 1}}, "task item.family: expected `str | null`, got `object`"),
    ({"metadata": [["k", 1]]}, "task item.metadata: expected `object | null`, got `array`"),
    ({"provenance": "row 1"}, "task item.provenance: expected `object | null`, got `str`"),
])
def test_task_item_from_dict_refuses_fields_that_are_not_text(changes, message):
    with pytest.raises(ValueError) as info:
        TaskItem.from_dict({**ITEM, **changes})
    assert str(info.value) == message


def test_task_item_from_dict_refuses_a_missing_field_and_a_non_object():
    with pytest.raises(ValueError, match="^task item: object missing required field `uid`$"):
        TaskItem.from_dict({k: v for k, v in ITEM.items() if k != "uid"})
    with pytest.raises(ValueError, match="^task item: expected `object`, got `array`$"):
        TaskItem.from_dict([ITEM])
