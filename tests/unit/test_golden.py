"""Every mode's golden run (tests/golden/) repeats its recorded metrics exactly: restructuring must not change
behaviour. The runs are served in process (no Ray), a few seconds each."""

from __future__ import annotations

import json

import pytest

from tests.golden.runs import GOLDEN_DIR, RUNS, golden_rows


@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_repeats_its_recorded_metrics(name, tmp_path):
    expected = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    rows = json.loads(json.dumps(golden_rows(name, tmp_path)))  # JSON types, as recorded
    assert [r["round"] for r in rows] == [r["round"] for r in expected]
    for got, want in zip(rows, expected):
        assert got == want, f"{name} round {want['round']} differs"
