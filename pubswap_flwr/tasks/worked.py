"""Worked solutions written by code from an item's own fields: each partial result on its line, then the answer tag."""

from __future__ import annotations

from .items import TaskItem

WORKED_GENERATORS = ("basic_arithmetic", "chain_sum")  # items whose metadata expression is `a op b op c ...`
OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def worked_solution(item: TaskItem) -> str:
    """"45 + 12 = 57\\n57 - 30 = 27\\n<answer>27</answer>" for an item whose metadata expression is "45 + 12 - 30",
    evaluated left to right (only + and -, where that order is the right one). ValueError when the item is of another
    generator, its expression is not terms joined by + and -, or the steps do not give the item's answer."""
    generator = item.metadata.get("source_dataset") or item.provenance.get("generator")
    if generator not in WORKED_GENERATORS:
        raise ValueError(f"item {item.uid!r}: no worked solution for generator {generator!r} "
                         f"(only {', '.join(WORKED_GENERATORS)})")
    expression = str(item.metadata.get("expression", ""))
    tokens = expression.split()
    if len(tokens) < 3 or len(tokens) % 2 == 0:
        raise ValueError(f"item {item.uid!r}: expression {expression!r} is not terms joined by operators")
    running = _integer(tokens[0], item)
    lines = []
    for op, term in zip(tokens[1::2], tokens[2::2]):
        if op not in OPERATORS:
            raise ValueError(f"item {item.uid!r}: operator {op!r} in {expression!r} (only + and -)")
        value = OPERATORS[op](running, _integer(term, item))
        lines.append(f"{running} {op} {term} = {value}")
        running = value
    if str(running) != str(item.answer).strip():
        raise ValueError(f"item {item.uid!r}: {expression!r} gives {running}, not the item's answer {item.answer!r}")
    return "\n".join(lines + [f"<answer>{running}</answer>"])


def _integer(text: str, item: TaskItem) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"item {item.uid!r}: term {text!r} of {item.metadata.get('expression')!r} is not an "
                         "integer") from None
