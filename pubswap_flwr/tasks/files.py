"""An organization's own data: JSONL or parquet rows (question, answer, optional verifier and metadata) as task items.

JSONL is parsed line by line, parquet is read through Hugging Face `datasets`. A JSONL line that is not JSON, or a row without a question or answer,
is reported with its line/row number: by default the file is refused (`on_bad_row="error"`), with
`on_bad_row="skip"` the row is skipped and logged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

from .items import TaskItem
from .specs import TaskError
from .verifiers import check_verifier

log = logging.getLogger(__name__)

RowAdapter = Callable[[dict[str, Any], int, str], TaskItem]


class BadRow(ValueError):
    """One row cannot become a task item; the message says why."""


def _generic_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    question = row.get("question")
    answer = row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise BadRow("missing or empty 'question'")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise BadRow("missing or empty 'answer'")
    if not isinstance(answer, (str, int, float)):
        raise BadRow(f"'answer' must be text or a number, got {type(answer).__name__}")
    verifier = row.get("verifier") or default_verifier
    if not isinstance(verifier, str):
        raise BadRow("'verifier' must be text")
    try:
        check_verifier(verifier, where=f"row {number}")
    except TaskError as err:
        raise BadRow(str(err)) from err
    metadata = row.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError as err:
            raise BadRow(f"'metadata' is not a JSON object: {err}") from err
    if not isinstance(metadata, dict):
        raise BadRow("'metadata' must be an object")
    task = row.get("task") or metadata.get("task") or "org"
    return TaskItem(uid=f"row/{number}", task=str(task), question=question, answer=str(answer).strip(),
                    verifier=verifier, metadata=metadata, provenance={"row": number}, family=str(row.get("family") or "plain"))


ADAPTERS: dict[str, RowAdapter] = {"generic": _generic_row}


def register_adapter(name: str, adapter: RowAdapter) -> None:
    ADAPTERS[name] = adapter


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    """(line/row number starting at 1, row dict or an error text) in file order.

    JSONL is parsed line by line so errors name the line; parquet goes through `datasets`.
    """
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".json"}:
        rows: list[tuple[int, dict[str, Any] | str]] = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    rows.append((number, f"not valid JSON ({err.msg})"))
                    continue
                rows.append((number, value if isinstance(value, dict) else "not a JSON object"))
        return rows
    if suffix == ".parquet":
        import datasets

        table = datasets.Dataset.from_parquet(str(path))
        return [(i + 1, dict(row)) for i, row in enumerate(table)]
    raise TaskError(f"{path}: unsupported data file type {suffix!r}; use .jsonl or .parquet")


def load_items(path: str | Path, *, fmt: str = "generic", default_verifier: str = "exact",
               on_bad_row: str = "error", uid_prefix: str = "org") -> list[TaskItem]:
    """Task items from a JSONL/parquet file. Raises TaskError naming the bad rows unless on_bad_row="skip"."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TaskError(f"data file not found: {path}")
    if fmt not in ADAPTERS:
        raise TaskError(f"unknown data format {fmt!r}; known: {', '.join(sorted(ADAPTERS))}")
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
