"""Every published report (docs/results/<sweep>/report.md and summary.json) regenerates byte for byte from the files
committed beside it and its sweep file, so no sentence or number in a generated report can go stale."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "results"
PUBLISHED = sorted(p.parent.name for p in DOCS.glob("*/outcomes.json"))
KEPT = ("metrics.jsonl", "config.json", "status.json", "provenance.json", "eval_items.jsonl")


def _sweep_file(name: str) -> Path:
    """The sweep file that published docs/results/<name>: named in its summary.json's command."""
    command = json.loads((DOCS / name / "summary.json").read_text())["command"]
    match = re.search(r"configs/(\S+\.toml)", command)
    assert match, f"{name}: summary.json's command names no sweep file: {command!r}"
    return ROOT / "configs" / match[1]


def test_every_published_sweep_is_found():
    assert len(PUBLISHED) >= 14 and "real-pubswap" in PUBLISHED


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_report_regenerates_byte_for_byte(name, tmp_path):
    from tests.unit.test_report_publish import _script

    source = DOCS / name
    copy = tmp_path / "docs" / name
    for run in (source / "runs").iterdir():  # the runs' small files: what the report reads (not the adapters)
        for file in KEPT:
            if (run / file).is_file():
                (copy / "runs" / run.name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / file, copy / "runs" / run.name / file)
    for file in ("outcomes.json", "summary.json"):
        shutil.copy2(source / file, copy / file)
    _script().regenerate(_sweep_file(name), docs=tmp_path / "docs")
    assert (copy / "report.md").read_text() == (source / "report.md").read_text(), (
        f"docs/results/{name}/report.md is stale: python scripts/publish_results.py --regenerate "
        f"{_sweep_file(name).relative_to(ROOT)}")
    assert (copy / "summary.json").read_text() == (source / "summary.json").read_text()
