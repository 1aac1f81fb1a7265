"""Reading one row of one section's table back out of a generated report.md."""

from __future__ import annotations


def table_row(text: str, heading: str, label: str) -> list[str]:
    """The cells after `label` in the row that starts with it, within the section under `## {heading}`."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]
