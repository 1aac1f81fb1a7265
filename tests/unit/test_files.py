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
    ({"answer": "4"}, "row 2: missing or empty 'question'"),
    ({"question": "   ", "answer": "4"}, "row 2: missing or empty 'question'"),
    ({"question": "q"}, "row 2: missing or empty 'answer'"),
    ({"question": "q", "answer": ""}, "row 2: missing or empty 'answer'"),
    ({"question": "q", "answer": ["4"]}, "row 2: 'answer' must be text or a number, got list"),
    ({"question": "q", "answer": "4", "verifier": "judge"}, "row 2: row 2: unknown verifier 'judge'"),
    ({"question": "q", "answer": "4", "verifier": 3}, "row 2: 'verifier' must be text"),
    ({"question": "q", "answer": "4", "metadata": "{oops"}, "row 2: 'metadata' is not a JSON object"),
    ({"question": "q", "answer": "4", "metadata": [1]}, "row 2: 'metadata' must be an object"),
]


@pytest.mark.parametrize("bad,message", BAD_ROWS, ids=[m for _b, m in BAD_ROWS])
def test_bad_row_is_an_error_naming_its_number(tmp_path, bad, message):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "ok", "answer": "1"}, bad, {"question": "ok too", "answer": "2"}])
    with pytest.raises(TaskError) as info:
        load_items(path)
    text = str(info.value)
    assert text.startswith(f"{path}: 1 malformed row(s): ")
    assert message in text


@pytest.mark.parametrize("bad,message", BAD_ROWS, ids=[m for _b, m in BAD_ROWS])
def test_bad_row_is_skipped_and_logged_with_skip(tmp_path, caplog, bad, message):
    path = tmp_path / "org.jsonl"
    write_jsonl(path, [{"question": "ok", "answer": "1"}, bad, {"question": "ok too", "answer": "2"}])
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr.tasks.files"):
        items = load_items(path, on_bad_row="skip")
    assert [i.uid for i in items] == ["org/1", "org/3"]
    assert any(message in record.getMessage() and "skipped" in record.getMessage() for record in caplog.records)


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
    with pytest.raises(TaskError, match=r"row 2: missing or empty 'answer'"):
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
