"""An organization's own data: JSONL or parquet rows (question, answer, optional verifier and metadata; declared as
`GenericRow`) as task items.

JSONL is parsed line by line, parquet is read through Hugging Face `datasets`. A JSONL line that is not UTF-8 text or
not JSON, is longer than MAX_ROW_BYTES or nests deeper than MAX_DEPTH, or a row without a question or answer (or
with an answer that is a boolean, a non-finite number or not text/number, text with a lone surrogate, a question
longer than generation.max-prompt-tokens x 32 chars (at least 8192) or an answer over 2048) is reported with its
line/row number: by default the file is refused (`on_bad_row="error"`), with `on_bad_row="skip"` the row is skipped
and logged. A file that is not readable parquet is a TaskError naming the file.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Callable

from msgspec import Struct

from ..registry import Registry
from ..schema import SchemaError, check_depth, parse
from .items import MAX_ANSWER_CHARS, MIN_QUESTION_CHARS, QUESTION_CHARS_PER_PROMPT_TOKEN, TaskItem, max_question_chars
from .specs import TaskError
from .verifiers import check_verifier

log = logging.getLogger(__name__)

RowAdapter = Callable[[dict[str, Any], int, str], TaskItem]

MAX_ROW_BYTES = 8 * 1024 * 1024  # one JSONL line; real rows (even with long worked solutions) are well under 1 MB
MAX_DEPTH = 16  # objects/lists nested below the row (metadata as deep as SAPO peers accept: validate.Limits)


class BadRow(ValueError):
    """One row cannot become a task item; the message says why."""


class GenericRow(Struct):
    """A row of the generic format: `question` text, `answer` text or a number (a bool is refused), optional
    `verifier`, `task` and `family` text and `metadata` (an object, or its JSON text as parquet columns hold it).
    Other keys are ignored."""

    question: str
    answer: str | int | float
    verifier: str | None = None
    metadata: dict[str, Any] | str | None = None
    task: str | None = None
    family: str | None = None

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError("missing or empty 'question'")
        if isinstance(self.answer, str) and not self.answer.strip():
            raise ValueError("missing or empty 'answer'")
        if isinstance(self.answer, float) and not math.isfinite(self.answer):
            raise ValueError(f"'answer' must be a finite number, got {self.answer!r}")


def _generic_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    try:
        fields = parse(row, GenericRow, "")
    except SchemaError as err:
        raise BadRow(str(err)) from None
    verifier = fields.verifier or default_verifier
    try:
        check_verifier(verifier, where=f"row {number}")
    except TaskError as err:
        raise BadRow(str(err)) from err
    metadata = fields.metadata or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except RecursionError:
            raise BadRow(f"'metadata' is nested more than {MAX_DEPTH} levels deep") from None
        except ValueError as err:  # JSONDecodeError, or an integer too long to convert
            raise BadRow(f"'metadata' is not a JSON object: {err}") from err
        _check_depth(metadata, "'metadata'", start=1)  # at the depth it has in the row
        if not isinstance(metadata, dict):
            raise BadRow("'metadata' must be an object")
    task = fields.task or metadata.get("task") or "org"
    if not isinstance(task, str):
        raise BadRow(f"metadata's 'task' must be text, got {type(task).__name__}")
    return TaskItem(uid=f"row/{number}", task=task, question=fields.question, answer=str(fields.answer).strip(),
                    verifier=verifier, metadata=metadata, provenance={"row": number}, family=fields.family or "plain")


def _check_depth(value: Any, what: str, start: int = 0) -> None:
    """Objects and lists nested at most MAX_DEPTH levels below the row, `value` being `start` levels below it."""
    try:
        check_depth(value, MAX_DEPTH, what, start)
    except ValueError as err:
        raise BadRow(str(err)) from None


ADAPTERS: Registry[RowAdapter] = Registry("data format", {"generic": _generic_row}, replace=True)


def register_adapter(name: str, adapter: RowAdapter) -> None:
    ADAPTERS.add(name, adapter)


def _json_row(raw: bytes, number: int) -> dict[str, Any] | str:
    """One JSONL line as a row dict, or the reason it is not one."""
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte order mark
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 text ({err.reason}: byte 0x{raw[err.start]:02x} at byte {err.start + 1} of the line)"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"not valid JSON ({err.msg})"
    except RecursionError:
        return f"nested more than {MAX_DEPTH} levels deep"
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        return f"not valid JSON ({err})"
    if not isinstance(value, dict):
        return "not a JSON object"
    try:
        _check_depth(value, "row")
    except BadRow as err:
        return str(err)
    return value


def _jsonl_rows(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    rows: list[tuple[int, dict[str, Any] | str]] = []
    with path.open("rb") as handle:
        number = 0
        while True:
            raw = handle.readline(MAX_ROW_BYTES + 1)
            if not raw:
                return rows
            number += 1
            if len(raw) > MAX_ROW_BYTES:
                while raw and not raw.endswith(b"\n"):  # skip the rest of the line
                    raw = handle.readline(1 << 20)
                rows.append((number, f"longer than {MAX_ROW_BYTES} bytes"))
                continue
            if not raw.strip():
                continue
            rows.append((number, _json_row(raw, number)))


def _parquet_rows(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    import datasets

    try:
        table = datasets.Dataset.from_parquet(str(path))
    except Exception as err:  # pyarrow's ArrowInvalid / OSError, or datasets' own errors
        raise TaskError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from err
    rows: list[tuple[int, dict[str, Any] | str]] = []
    for i, row in enumerate(table):
        try:
            _check_depth(row, "row")
        except BadRow as err:
            rows.append((i + 1, str(err)))
            continue
        rows.append((i + 1, dict(row)))
    return rows


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    """(line/row number starting at 1, row dict or an error text) in file order.

    JSONL is read line by line as bytes, so errors (not UTF-8, not JSON, too long, too deep) name the line;
    parquet goes through `datasets`.
    """
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json"}:
        return _jsonl_rows(path)
    if suffix == ".parquet":
        return _parquet_rows(path)
    raise TaskError(f"{path}: unsupported data file type {suffix!r}; use .jsonl or .parquet")


def _check_item(item: TaskItem, max_question: int) -> None:
    """What any row format made of a row: text a tokenizer can take (a JSON escape can hold a lone surrogate, which
    fails only in the tokenizer), a question and answer within their limits."""
    if len(item.question) > max_question:
        raise BadRow(f"'question' has {len(item.question)} chars, over the {max_question} limit "
                     f"(generation.max-prompt-tokens x {QUESTION_CHARS_PER_PROMPT_TOKEN}, at least "
                     f"{MIN_QUESTION_CHARS})")
    if item.answer is not None and len(item.answer) > MAX_ANSWER_CHARS:
        raise BadRow(f"'answer' has {len(item.answer)} chars, over the {MAX_ANSWER_CHARS} limit")
    for key, value in (("question", item.question), ("answer", item.answer or ""), ("task", item.task),
                       ("family", item.family), ("metadata", json.dumps(item.metadata, ensure_ascii=False))):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise BadRow(f"{key!r} is not valid Unicode text ({err.reason} at position {err.start})") from None


def load_items(path: str | Path, *, fmt: str = "generic", default_verifier: str = "exact",
               on_bad_row: str = "error", uid_prefix: str = "org",
               max_question: int = max_question_chars(256)) -> list[TaskItem]:
    """Task items from a JSONL/parquet file. Raises TaskError naming the bad rows unless on_bad_row="skip".
    `max_question`: the longest question in chars (items.max_question_chars of the run's generation.max-prompt-tokens;
    the default's is 256)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TaskError(f"data file not found: {path}")
    ADAPTERS.lookup(fmt, TaskError)
    if on_bad_row not in {"error", "skip"}:
        raise TaskError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    check_verifier(default_verifier, where="default verifier")
    adapter = ADAPTERS[fmt]
    items: list[TaskItem] = []
    bad: list[str] = []
    for number, row in _read_rows(path):
        if isinstance(row, str):
            bad.append(f"line {number}: {row}")
            continue
        try:
            item = adapter(row, number, default_verifier)
            _check_item(item, max_question)
        except BadRow as err:
            bad.append(f"row {number}: {err}")
            continue
        items.append(TaskItem(uid=f"{uid_prefix}/{number}", task=item.task, question=item.question,
                              answer=item.answer, verifier=item.verifier, metadata=item.metadata,
                              provenance={**item.provenance, "file": path.name}, family=item.family))
    if bad and on_bad_row == "error":
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise TaskError(f"{path}: {len(bad)} malformed row(s): {shown}")
    for problem in bad:
        log.warning("%s: skipped %s", path, problem)
    if not items:
        raise TaskError(f"{path}: no usable rows")
    return items
