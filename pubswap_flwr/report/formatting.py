"""How the report writes numbers: intervals and spreads in report.md cells, and their summary.json records."""

from __future__ import annotations

import re
import statistics

from .statistics import NAN, Interval, finite

# what could turn a run's text into a link, image, HTML, emphasis or another table cell; `_` only at a word's edge
# (count_bits stays as it is), `(` and `.` not at all (they do nothing without the escaped `[` or a line start)
_MARKDOWN = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def escape_markdown(text: object) -> str:
    """Text from a run's files (arm, mode, task and run names, provenance, failure details) as literal text in
    report.md: markdown punctuation backslash-escaped, `<`, `>` and `&` as HTML entities, line breaks as spaces."""
    text = re.sub(r"[\r\n]+", " ", str(text))
    text = _MARKDOWN.sub(lambda m: "\\" + m.group(0), text)
    return re.sub(r"[<>&]", lambda m: _HTML[m.group(0)], text)


def code_span(text: object) -> str:
    """Text from a run's files inside a `code span`: no backtick can close it, no line break end it, no HTML
    (entities show as written: a sign that the text held markup)."""
    text = re.sub(r"[\r\n]+", " ", str(text)).replace("`", "'")
    return re.sub(r"[<>&]", lambda m: _HTML[m.group(0)], text)


def fmt_number(value: float, digits: int, signed: bool) -> str:
    """`value` to `digits` places, with its sign when `signed` (a signed zero is written without one)."""
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return "0." + "0" * digits if signed and float(text) == 0 and digits > 0 else text


def fmt_value(value: float, digits: int = 3) -> str:
    """`value` to `digits` places; `–` for NaN (not recorded)."""
    return "–" if value != value else f"{value:.{digits}f}"


def fmt_ci(interval: Interval, digits: int = 3, signed: bool = False) -> str:
    """`mean [low, high]`; `mean [n/a]` from one value (no interval can be estimated); `–` from none."""
    if interval.n == 0:
        return "–"
    mean = fmt_number(interval.mean, digits, signed)
    if not interval.has_interval:
        return f"{mean} [n/a]"
    return f"{mean} [{fmt_number(interval.low, digits, signed)}, {fmt_number(interval.high, digits, signed)}]"


def fmt_spread(values: list[float], digits: int = 1) -> str:
    """`median (min–max)` of the finite values; the value alone from one; `–` from none."""
    clean = sorted(finite(values))
    if not clean:
        return "–"
    median = f"{statistics.median(clean):.{digits}f}"
    return median if len(clean) == 1 else f"{median} ({clean[0]:.{digits}f}–{clean[-1]:.{digits}f})"


def fmt_rounds(values: list[float]) -> str:
    """The number of rounds, or its range where the runs differ."""
    rounds = sorted({int(v) for v in values})
    return str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}–{rounds[-1]}"


def interval_json(interval: Interval, values: list[float]) -> dict:
    """summary.json's record of an interval and the values it was estimated from."""
    return {"mean": interval.mean, "ci_low": interval.low, "ci_high": interval.high, "n": interval.n,
            "sd": interval.sd, "values": values}


def spread_json(values: list[float]) -> dict:
    """summary.json's record of a median and range and the values they were taken from."""
    clean = sorted(finite(values))
    return {"median": statistics.median(clean) if clean else NAN, "min": clean[0] if clean else NAN,
            "max": clean[-1] if clean else NAN, "n": len(clean), "values": values}
