"""benchmarks/fast_tier_load.py's printed times: whole minutes, never rounded up."""

from __future__ import annotations

from tests.scripts import load_script


def _benchmark():
    return load_script("benchmarks/fast_tier_load.py")


def test_minutes_are_whole_minutes_and_seconds_the_rest():
    fmt = _benchmark().minutes_and_seconds
    assert fmt(651.87) == "10 min 52 s"  # printed "11 min 52 s" before the fix
    assert fmt(214.25) == "3 min 34 s"
    assert fmt(59.6) == "1 min 00 s" and fmt(0.4) == "0 min 00 s"
