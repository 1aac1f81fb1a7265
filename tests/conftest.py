"""Shared fixtures: the shipped embedded model, small policies, and hermetic environment variables."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")


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
