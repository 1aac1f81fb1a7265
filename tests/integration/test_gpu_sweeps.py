"""scripts/gpu_sweeps.py at its dry-run size on the CPU: several runs at once without Ray, written where
`pubswap compare` writes them, each sweep's outcomes and report; completed runs are skipped when run again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_dry_size_sweeps_run_side_by_side_and_resume(tmp_path):
    sweep = tmp_path / "two.toml"
    sweep.write_text('name = "two"\nnodes = 2\nseeds = [0]\n[config]\ntasks.mix = "gcd:1"\n'
                     'strategy.apply-below-robust = true\n'
                     '[arms.fedavg]\nstrategy.mode = "fedavg"\n[arms.none]\nstrategy.mode = "pubswap"\n'
                     'pubswap.swap = "none"\n')
    command = [sys.executable, str(ROOT / "scripts" / "gpu_sweeps.py"), str(sweep), "--out", str(tmp_path / "out"),
               "--parallel", "2", "--dry-size"]
    first = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 runs, 2 at once" in first.stdout and "0 failed" in first.stdout
    out = tmp_path / "out" / "two"
    outcomes = json.loads((out / "outcomes.json").read_text())
    assert sorted((o["arm"], o["status"], o["reused"]) for o in outcomes) == [("fedavg", "completed", False),
                                                                             ("none", "completed", False)]
    for arm in ("fedavg", "none"):
        rows = [json.loads(line) for line in (out / "runs" / f"{arm}-s0" / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2]
        config = json.loads((out / "runs" / f"{arm}-s0" / "config.json").read_text())["config"]
        assert config["model.name"] == "embedded:tiny" and config["model.threads"] == 1
    assert (out / "report.md").is_file()
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert again.returncode == 0
    assert all(o["reused"] for o in json.loads((out / "outcomes.json").read_text()))
