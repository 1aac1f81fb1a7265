"""Multiple-choice answers: the "mc" verifier, which reads one option letter (or one option's text) from an answer.

The options come from `item.metadata["options"]` ({letter: text}, or a list read as A, B, ...) or, failing that,
from question lines such as "B. text", "B) text" or "(B) text"; without any, letters A-E are allowed. The reference
answer is a letter. Accepted forms of option B: "B", "b", "(B)", "B.", "B)", "B:", "Option B", "Answer: (B)",
"The answer is B", "B. <any text>", "(B) <any text>", "B <option B's text>", and option B's text, alone or after
such a prefix (case- and whitespace-insensitive, a trailing period ignored). Rejected (reward 0): answers that name
two or more options ("B or C", "A, B", "A and B", "A/B", "B. text or C. text"), a letter with a different option's
exact text ("B. <option C's text>"), letters that are not options, and anything else.
"""

from __future__ import annotations

import re
from typing import Any

from .items import TaskItem
from .verifiers import register_verifier

DEFAULT_LETTERS = "ABCDE"
MAX_CHOICE_CHARS = 2000

# Every pattern here reads model or peer text (answers, and in SAPO questions), so each is written to match in linear
# time: no two quantified pieces can take the same characters (tests/unit/test_regex_bounds.py checks each on
# adversarial text). Option text's trailing blanks are stripped in Python, not by the regex.
_OPTION_LINE = re.compile(r"^[ \t]*(?:\(([A-J])\)|([A-J])[.):])[ \t]+(\S.*)$", re.MULTILINE)
_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+|best\s+)?(?:answer|option|choice)(?:\s+is)?\s*(?:[:\-]\s*)?)(?=\S)",
    re.IGNORECASE,
)
# One option letter: "B", "(B", "B)", "(B)", "B.", "B:", "B).", "B))" ... (the suffix was `\)?[.):]?`, which could
# take a ")" two ways and made a list of tokens backtrack exponentially).
_TOKEN = r"\(?[A-Za-z](?![A-Za-z0-9])(?:\)[.):]?|[.:])?"
# Two or more tokens, each pair separated by blanks and at most one separator; the blanks after a separator belong
# to the separator (the pattern was `\s*(?:sep)?\s*`, whose two `\s*` could split the same blanks many ways).
_LETTER_LIST = re.compile(
    rf"^{_TOKEN}(?:\s*(?:(?:,|/|&|;|\+|\bor\b|\band\b|,\s*or\b|,\s*and\b)\s*)?{_TOKEN})+$", re.IGNORECASE
)
_LETTER = re.compile(r"^(\()?([A-Za-z])(?(1)\))(?![A-Za-z0-9])(.*)$", re.DOTALL)
_ANOTHER = re.compile(r"(?:^|[\s,;/])(?:or|and)\s+\(?([A-J])\)?(?:[.):]|\s|$)")


def option_key(text: str) -> str:
    """Option text for comparison: case-folded, whitespace collapsed, a trailing period dropped."""
    return " ".join(str(text).split()).casefold().rstrip(".").strip()


def options_of(item: TaskItem) -> dict[str, str]:
    """{letter: text} for `item`: metadata["options"] when present, else option lines parsed from the question."""
    raw = item.metadata.get("options")
    if isinstance(raw, dict) and raw:
        return {str(letter).strip().upper(): str(text) for letter, text in raw.items() if text is not None}
    if isinstance(raw, (list, tuple)) and raw:
        return {chr(ord("A") + i): str(text) for i, text in enumerate(raw)}
    found: dict[str, str] = {}
    for match in _OPTION_LINE.finditer(item.question):
        found.setdefault(match.group(1) or match.group(2), match.group(3).rstrip(" \t"))
    return found if len(found) >= 2 else {}


def _text_match(text: str, options: dict[str, str]) -> str | None:
    """The one letter whose option text equals `text` (normalized), or None (no match, or several)."""
    wanted = option_key(text)
    if not wanted:
        return None
    letters = [letter for letter, option in options.items() if option_key(option) == wanted]
    return letters[0] if len(letters) == 1 else None


def parse_choice(answer: str, options: dict[str, str], letters: str | None = None) -> str | None:
    """The single option letter `answer` names, or None when it names none or more than one."""
    allowed = set(options) if options else set(letters or DEFAULT_LETTERS)
    text = answer.strip().strip("*`'\"").strip()
    if not text or len(text) > MAX_CHOICE_CHARS:
        return None
    if options:
        by_text = _text_match(text, options)
        if by_text is not None:
            return by_text
    stripped = _PREFIX.sub("", text, count=1)
    if stripped != text and options:
        by_text = _text_match(stripped, options)  # "Answer: Pancreas"
        if by_text is not None:
            return by_text
    text = stripped
    if _LETTER_LIST.match(text):
        return None  # "B or C", "A, B", "A and B": more than one option
    match = _LETTER.match(text)
    if match is None:
        return None
    parenthesized, letter, rest = bool(match.group(1)), match.group(2).upper(), match.group(3)
    if letter not in allowed:
        return None
    if not rest.strip():
        return letter
    punctuated = rest[0] in ".):" and not (parenthesized and rest[0] == ")")
    if not punctuated and not (parenthesized and rest[0].isspace()):
        # "B <text>": only when the text is option B's text ("B or C because ..." names no single option)
        return letter if options and option_key(rest) == option_key(options.get(letter, "")) else None
    detail = rest[1:] if punctuated else rest
    if any(found in allowed and found != letter for found in _ANOTHER.findall(detail)):
        return None  # "B. text or C. text"
    if options and detail.strip():
        named = _text_match(detail, options)
        if named is not None and named != letter:
            return None  # "B. <option C's text>": contradictory
    return letter


def _gold_letter(item: TaskItem, options: dict[str, str]) -> str:
    if item.answer is None:
        raise ValueError("item has no reference answer")
    gold = item.answer.strip().strip("().").strip().upper()
    if len(gold) != 1 or not gold.isalpha():
        raise ValueError(f"reference answer {item.answer!r} is not an option letter")
    if options and gold not in options:
        raise ValueError(f"reference answer {gold!r} is not one of the options {''.join(sorted(options))}")
    return gold


def score_choice(answer: str, item: TaskItem) -> float:
    """1.0 when `answer` names exactly the reference option, else 0.0; ValueError for a malformed item."""
    options = options_of(item)
    gold = _gold_letter(item, options)
    letters = None if options else "".join(sorted(set(DEFAULT_LETTERS) | {gold}))
    return 1.0 if parse_choice(answer, options, letters) == gold else 0.0


def render_options(options: dict[str, Any]) -> str:
    """Option lines "A. text" in letter order."""
    return "\n".join(f"{letter}. {options[letter]}" for letter in sorted(options))


register_verifier("mc", score_choice)
