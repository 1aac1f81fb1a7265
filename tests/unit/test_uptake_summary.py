"""scripts/uptake_summary.py: the per-round uptake entries and their response-weighted totals."""

from __future__ import annotations

import pytest

from tests.scripts import load_script


def _script():
    return load_script("scripts/uptake_summary.py")


ROWS = [
    {"round": 0},
    {"round": 1, "clients": {
        "9": {"node_index": 1, "uptake_foreign_completions": 3, "uptake_foreign_before": -0.3,
              "uptake_foreign_after": -0.2, "uptake_own_completions": 5, "uptake_own_before": -0.1,
              "uptake_own_after": -0.12},
        "4": {"node_index": 0, "uptake_foreign_completions": 0, "uptake_own_completions": 8,
              "uptake_own_before": -0.2, "uptake_own_after": -0.2}}},
    {"round": 2, "clients": {"4": {"node_index": 0, "uptake_foreign_completions": 1, "uptake_foreign_before": -0.5,
                                   "uptake_foreign_after": -0.3}}},
]


def test_entries_in_round_and_client_order_skip_kinds_without_responses():
    entries = _script().uptake_rows(ROWS)
    assert [(e["round"], e["client"], e["kind"], e["n"]) for e in entries] == [
        (1, 0, "own", 8), (1, 1, "foreign", 3), (1, 1, "own", 5), (2, 0, "foreign", 1)]


def test_totals_weight_by_responses():
    totals = _script().totals(_script().uptake_rows(ROWS))
    foreign, own = totals["foreign"], totals["own"]
    assert (foreign["client_rounds"], foreign["responses"], foreign["positive"]) == (2, 4, 2)
    assert foreign["before"] == pytest.approx((3 * -0.3 - 0.5) / 4)
    assert foreign["after"] == pytest.approx((3 * -0.2 - 0.3) / 4)
    assert foreign["median_change"] == pytest.approx(0.15)
    assert own["positive"] == 0 and own["before"] == pytest.approx((5 * -0.1 + 8 * -0.2) / 13)


def test_a_run_without_uptake_fields_is_an_error(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    assert _script().main([str(tmp_path)]) == 2
    assert "no uptake_* fields" in capsys.readouterr().err
