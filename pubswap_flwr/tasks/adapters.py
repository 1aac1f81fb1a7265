"""Row adapters for public dataset shapes (MATH, DeepMath, MedQA, MedMCQA) as `files.load_items` formats.

Each adapter turns one JSONL/parquet row into a TaskItem or raises BadRow with the reason (load_items reports the
line/row number). These formats fix their own verifier ("math" or "mc") and ignore load_items' default verifier.

* "math" (MATH / MATH-500): `problem`, and the reference from `answer` when present (MATH-500) else the last
  \\boxed{} of `solution`; optional `type` or `subject`, `level`. Verifier "math", family "math".
* "deepmath" (DeepMath-103K): `question`, `final_answer` (text or number); optional `difficulty`, `topic`.
  Verifier "math", family "math".
* "medqa": `question`, `options` as {letter: text} (a parquet struct column may hold None for absent letters,
  which are dropped), a list of texts (read as A, B, ...) or a list of {"key", "value"} (BigBio); the reference
  is `answer_idx` (a letter) or, without it, the option whose text equals `answer`; when both are given they must
  agree. Optional `meta_info`. Verifier "mc", family "mc".
* "medmcqa": `question`, `opa`..`opd`, `cop`. Assumed convention: the Hugging Face dataset
  (openlifescienceai/medmcqa), where `cop` is a 0-based class index 0-3 (a, b, c, d) and the unlabelled test
  split has cop = -1 (refused as a bad row). A letter a-d is accepted too. The original release's JSON used 1-4;
  load such files with the "medmcqa-1based" format. Optional `id`, `subject_name`, `topic_name`, `choice_type`.
  Verifier "mc", family "mc".

Multiple-choice questions carry their options in the question text as "A. text" lines (what the prompt shows)
and in metadata["options"] (what the "mc" verifier reads).
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from . import choice, math_answers  # noqa: F401 - registers the "math" and "mc" verifiers these items name
from .choice import option_key, render_options
from .files import BadRow, register_adapter
from .items import TaskItem
from .math_answers import last_boxed

MAX_OPTIONS = 10  # letters A-J


@overload
def _text(row: dict[str, Any], key: str, *, required: Literal[True] = ...) -> str: ...
@overload
def _text(row: dict[str, Any], key: str, *, required: bool) -> str | None: ...
def _text(row: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise BadRow(f"missing or empty {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRow(f"{key!r} must be text, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        if required:
            raise BadRow(f"{key!r} must be text or a finite number, got {value!r}")
        return None  # an absent optional number (pandas writes a missing float as NaN)
    return str(value).strip()  # integers stay exact (no float round trip)


def _plain(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    if isinstance(value, float):
        return math.isfinite(value)  # parquet gives NaN for a missing number
    return bool(str(value).strip())


def _optional(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The given fields that are present and plain (text or a finite number), for metadata."""
    return {key: row[key] for key in keys if _plain(row.get(key))}


def _math_item(task: str, number: int, question: str, answer: str, metadata: dict[str, Any]) -> TaskItem:
    return TaskItem(uid=f"{task}/{number}", task=task, question=question, answer=answer, verifier="math",
                    metadata=metadata, provenance={"row": number, "format": task}, family="math")


def _mc_item(task: str, number: int, question: str, options: dict[str, str], gold: str,
             metadata: dict[str, Any]) -> TaskItem:
    text = f"{question}\n{render_options(options)}"
    return TaskItem(uid=f"{task}/{number}", task=task, question=text, answer=gold, verifier="mc",
                    metadata={"options": dict(options), **metadata}, provenance={"row": number, "format": task},
                    family="mc")


# --- math ---------------------------------------------------------------------------------------------------------


def math_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    problem = _text(row, "problem")
    answer = _text(row, "answer", required=False)
    if answer is None:
        solution = _text(row, "solution", required=False)
        if solution is None:
            raise BadRow("missing 'answer' and 'solution'")
        answer = last_boxed(solution)
        if answer is None:
            raise BadRow("'solution' has no closed \\boxed{...} answer")
        answer = answer.strip()
        if not answer:
            raise BadRow("'solution' has an empty \\boxed{}")
    metadata = _optional(row, "type", "subject", "level", "unique_id")
    return _math_item("math", number, problem, answer, metadata)


def deepmath_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    question = _text(row, "question")
    answer = _text(row, "final_answer")
    metadata = _optional(row, "difficulty", "topic")
    return _math_item("deepmath", number, question, answer, metadata)


# --- multiple choice ----------------------------------------------------------------------------------------------


def _letters(count: int) -> list[str]:
    return [chr(ord("A") + i) for i in range(count)]


def _medqa_options(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        pairs = [(str(key).strip().upper(), value) for key, value in raw.items() if value is not None]
    elif isinstance(raw, (list, tuple)):
        if raw and all(isinstance(entry, dict) for entry in raw):
            try:
                pairs = [(str(entry["key"]).strip().upper(), entry["value"]) for entry in raw]
            except KeyError as err:
                raise BadRow(f"'options' entries need 'key' and 'value', one lacks {err}") from err
        else:
            pairs = list(zip(_letters(len(raw)), raw))
    else:
        raise BadRow(f"'options' must be an object or a list, got {type(raw).__name__}")
    options: dict[str, str] = {}
    allowed = set(_letters(MAX_OPTIONS))
    for letter, text in pairs:
        if letter not in allowed:
            raise BadRow(f"option key {letter!r} is not a letter A-J")
        if letter in options:
            raise BadRow(f"option {letter} given twice")
        if (isinstance(text, bool) or not isinstance(text, (str, int, float)) or not str(text).strip()
                or (isinstance(text, float) and not math.isfinite(text))):
            raise BadRow(f"option {letter} is empty or not text: {text!r}")
        options[letter] = " ".join(str(text).split())
    if len(options) < 2:
        raise BadRow(f"need at least 2 options, got {len(options)}")
    if sorted(options) != _letters(len(options)):
        raise BadRow(f"option letters {''.join(sorted(options))} are not consecutive from A")
    return options


def medqa_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    question = _text(row, "question")
    if "options" not in row or row["options"] is None:
        raise BadRow("missing 'options'")
    options = _medqa_options(row["options"])
    letter = _text(row, "answer_idx", required=False)
    answer_text = _text(row, "answer", required=False)
    by_text = None
    if answer_text is not None:
        matches = [key for key, text in options.items() if option_key(text) == option_key(answer_text)]
        if len(matches) > 1:
            raise BadRow(f"'answer' {answer_text!r} matches several options")
        by_text = matches[0] if matches else None
    if letter is not None:
        letter = letter.strip("().").strip().upper()
        if letter not in options:
            raise BadRow(f"'answer_idx' {letter!r} is not one of the options {''.join(options)}")
        if answer_text is not None and by_text != letter:
            raise BadRow(f"'answer_idx' {letter} does not match 'answer' {answer_text!r}")
    elif answer_text is not None:
        if by_text is None:
            raise BadRow(f"'answer' {answer_text!r} is not the text of any option")
        letter = by_text
    else:
        raise BadRow("missing 'answer_idx' and 'answer'")
    return _mc_item("medqa", number, question, options, letter, _optional(row, "meta_info"))


def _medmcqa_row(row: dict[str, Any], number: int, *, base: int) -> TaskItem:
    question = _text(row, "question")
    options = {}
    for letter, key in zip("ABCD", ("opa", "opb", "opc", "opd")):
        options[letter] = " ".join(_text(row, key).split())
    cop = row.get("cop")
    if isinstance(cop, str) and cop.strip().lower() in {"a", "b", "c", "d"}:
        index = "abcd".index(cop.strip().lower())
    else:
        if isinstance(cop, str) and cop.strip().lstrip("-").isdigit():
            cop = int(cop.strip())
        if isinstance(cop, float) and cop.is_integer():
            cop = int(cop)
        if isinstance(cop, bool) or not isinstance(cop, int):
            raise BadRow(f"'cop' must be an option index, got {cop!r}")
        if cop == -1 and base == 0:
            raise BadRow("'cop' is -1 (no correct option: unlabelled test split)")
        index = cop - base
        if not 0 <= index < 4:
            raise BadRow(f"'cop' {cop} is outside {base}-{base + 3}")
    metadata = _optional(row, "id", "subject_name", "topic_name", "choice_type")
    return _mc_item("medmcqa", number, question, options, "ABCD"[index], metadata)


def medmcqa_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    return _medmcqa_row(row, number, base=0)


def medmcqa_1based_row(row: dict[str, Any], number: int, default_verifier: str) -> TaskItem:
    return _medmcqa_row(row, number, base=1)


register_adapter("math", math_row)
register_adapter("deepmath", deepmath_row)
register_adapter("medqa", medqa_row)
register_adapter("medmcqa", medmcqa_row)
register_adapter("medmcqa-1based", medmcqa_1based_row)
