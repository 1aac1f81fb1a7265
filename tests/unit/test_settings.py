"""Each sampling and update default is written once (pubswap_flwr/settings.py): the config's generation.* and
train.* keys take theirs from the settings dataclasses, and a default run config builds the default settings."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.config.sections import GenerationConfig, TrainConfig
from pubswap_flwr.settings import GenerationSettings, GRPOSettings
from pubswap_flwr.shared import policy_spec

SECTIONS = Path(__file__).resolve().parents[2] / "pubswap_flwr" / "config/sections.py"


def _opt_defaults(path: Path, section: str) -> dict[str, ast.expr]:
    """The first argument of each field's opt(...) in the config sections file's class `section`."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == section).body
    return {n.target.id: n.value.args[0] for n in body
            if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Call) and n.value.args}


def literal_defaults(path: Path) -> list[str]:
    """Keys the config sections at `path` give a default of their own instead of settings.py's."""
    found = []
    for section, settings, constant in ((GenerationConfig, GenerationSettings, "GENERATION"),
                                        (TrainConfig, GRPOSettings, "GRPO")):
        shared = {f.name for f in fields(section)} & {f.name for f in fields(settings)}
        assert len(shared) >= 8
        defaults = _opt_defaults(path, section.__name__)
        found += [f"{section.__name__}.{name}" for name in sorted(shared)
                  if ast.unparse(defaults[name]) != f"{constant}.{name}"]
    return found


def test_the_config_writes_no_default_of_its_own_for_a_setting():
    assert literal_defaults(SECTIONS) == []


def test_the_default_run_config_builds_the_default_settings():
    spec = policy_spec(ExperimentConfig())
    assert spec.grpo == GRPOSettings() and spec.generation == GenerationSettings()
    assert spec.grpo.learning_rate == ExperimentConfig().train.learning_rate == 2e-3


def test_the_check_finds_a_literal_default(tmp_path):
    copy = tmp_path / "sections.py"
    copy.write_text(SECTIONS.read_text().replace("opt(GRPO.is_cap,", "opt(2.0,")
                    .replace("opt(GENERATION.top_k,", "opt(0,"))
    assert literal_defaults(copy) == ["GenerationConfig.top_k", "TrainConfig.is_cap"]
