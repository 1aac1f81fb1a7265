"""The Flower app bundle (FAB) stays far below Flower's 10 MB cap and carries the app, not run outputs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk
from flwr.common.constant import FAB_MAX_SIZE

PROJECT = Path(__file__).resolve().parents[2]


def test_fab_is_small_and_holds_the_app_and_the_example_reward_but_no_weights_or_runs():
    fab = build_fab_from_disk(PROJECT)  # about 9 s on 2 cores: one bundle for every check of it
    assert len(fab) < FAB_MAX_SIZE / 5
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert {"client_app.py", "server_app.py", "pubswap_flwr/protocols/pubswap.py", "pyproject.toml"} <= set(names)
    assert {"examples/__init__.py", "examples/my_reward.py"} <= set(names)  # tasks.rewards' example travels with it
    assert not any(n.startswith(("runs/", "results/", ".venv/", "docs/", "benchmarks/", ".grimp_cache/"))
                   or n.endswith(".safetensors") for n in names)  # a run reads none of them
    # Flower never ships weights, so the app finds the embedded models through the installed checkout instead.
    assert "data/models/tiny/config.json" in names and "data/models/tiny/model.safetensors" not in names


def test_flower_home_and_report_files_left_in_the_checkout_stay_out_of_the_bundle(tmp_path):
    """The README once advised FLWR_HOME=$PWD/.flwr-home, and `pubswap report` wrote report.md into the directory it
    ran from: each next bundle carried the last (1.8 -> 5.2 -> 12 MB, the fourth refused). .gitignore keeps them
    out (Flower applies it to the bundle); checked on a copy of the app, so nothing is written into the checkout."""
    import shutil

    for name in ("pyproject.toml", ".gitignore", "client_app.py", "server_app.py", "README.md",
                 "data/samples/org.jsonl", "tests/golden/fedavg.json", "docs/results/README.md",
                 "benchmarks/real_model.py"):  # each fab-exclude pattern must match a file
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT / name, tmp_path / name)
    planted = [".flwr-home/apps/pubswap.pubswap-flwr/pyproject.toml", ".flwr-home/config.toml", "report.md",
               "summary.json", "runs/report/report.md", "results/sweep/summary.json"]
    for name in planted:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" if name.endswith(".toml") else "{}")
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(tmp_path))).namelist()
    assert {"client_app.py", "server_app.py", "pyproject.toml", "README.md"} <= set(names)
    assert not set(planted) & set(names)
