"""The Flower app bundle (FAB) stays far below Flower's 10 MB cap and carries the app, not run outputs."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk
from flwr.common.constant import FAB_MAX_SIZE

PROJECT = Path(__file__).resolve().parents[2]


def test_fab_is_small_and_holds_the_app_but_no_weights_or_runs():
    fab = build_fab_from_disk(PROJECT)
    assert len(fab) < FAB_MAX_SIZE / 5
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert {"client_app.py", "server_app.py", "pubswap_flwr/protocols/pubswap.py", "pyproject.toml"} <= set(names)
    assert not any(n.startswith(("runs/", "results/", ".venv/", "docs/results/")) or n.endswith(".safetensors")
                   for n in names)
    # Flower never ships weights, so the app finds the embedded models through the installed checkout instead.
    assert "data/models/tiny/config.json" in names and "data/models/tiny/model.safetensors" not in names
