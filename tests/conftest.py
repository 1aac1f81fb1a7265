"""Shared fixtures: the shipped embedded model, small policies, and hermetic environment variables."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
# One OpenMP / MKL / BLAS thread for the test process and everything it starts (Flower and Ray processes, scorers,
# warm workers inherit the environment): the models under test are small, and threads that outnumber free cores
# spin (the fast tier did not finish in 15 min beside a sweep with torch's default threads; 4 min with one). A
# test that checks the thread policy itself sets or removes these variables with monkeypatch. Set here, before any
# test module imports torch; PUBSWAP_TEST_THREADS overrides the count.
_THREADS = os.environ.get("PUBSWAP_TEST_THREADS", "1")
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    if not os.environ.get(_variable):
        os.environ[_variable] = _THREADS


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    """torch's intra-op threads as the environment above says (torch may have been imported before conftest)."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    yield


# The smallest valid PNG (1x1, grey): what a report's figure file holds in tests that do not render figures
UNRENDERED_PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010800000000"
                               "3a7e9b550000000a49444154789c63680000008200816cc96d4a0000000049454e44ae426082")


@pytest.fixture(autouse=True)
def _figures_unrendered(request, monkeypatch):
    """Reports build every figure (tests read their artists, ticks and titles) but do not lay out and draw them:
    rendering was most of a report test's time, and no test compares pixels. A test marked `rendered_figures`
    renders them for real (tests/unit/test_report_files.py checks the PNG itself)."""
    if request.node.get_closest_marker("rendered_figures") is None:
        from pubswap_flwr.report import plots

        monkeypatch.setattr(plots, "render_png", lambda fig: UNRENDERED_PNG)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A test that runs a `pubswap` command configures the package's console logging for the whole process; each test
    starts from the same logging state instead (a command's INFO lines otherwise reached the next tests' stderr)."""
    import logging

    names = ("", "flwr", "pubswap_flwr", "pubswap_flwr.clients")
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate)
             for logger in map(logging.getLogger, names)]
    yield
    for logger, handlers, level, propagate in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.fixture(scope="session")
def tiny_location() -> str:
    from pubswap_flwr.policy.model import resolve_model

    return resolve_model("embedded:tiny")


@pytest.fixture()
def tiny_policy():
    """A fresh Policy on the shipped model (LoRA r=8 so tests stay quick)."""
    import torch

    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec

    torch.manual_seed(0)
    return Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16)))
