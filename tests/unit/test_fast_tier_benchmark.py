"""benchmarks/fast_tier_load.py's printed times: whole minutes, never rounded up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("fast_tier_load", ROOT / "benchmarks" / "fast_tier_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_minutes_are_whole_minutes_and_seconds_the_rest():
    fmt = _benchmark().minutes_and_seconds
    assert fmt(651.87) == "10 min 52 s"  # printed "11 min 52 s" before the fix
    assert fmt(214.25) == "3 min 34 s"
    assert fmt(59.6) == "1 min 00 s" and fmt(0.4) == "0 min 00 s"
