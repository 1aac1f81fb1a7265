"""The node side takes its parameters through constructors (#38 item 2): a Learner is built from NodeSettings, a mode's
own section reaches its node side as a constructor argument, and no node-side module reads a run config's `.cfg`."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from pubswap_flwr.algorithms.sapo_selection import Packet
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.protocols.sapo import SapoNode
from pubswap_flwr.tasks import MixtureStream, StreamCursor

PACKAGE = Path(__file__).resolve().parents[2] / "pubswap_flwr"
NODE_SIDE = ["node", "node_runtime/serving.py", "protocols/sapo.py", "protocols/sapo_verify.py", "protocols/pubswap.py",
             "protocols/fedavg.py", "protocols/local.py", "protocols/transfer.py"]


def cfg_reads(source: str) -> list[int]:
    """Lines of `source` that read an attribute named `cfg` (`learner.cfg.sapo`, `work.cfg`, `self.cfg`)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Attribute) and node.attr == "cfg")


def node_side_files() -> list[Path]:
    files: list[Path] = []
    for part in NODE_SIDE:
        path = PACKAGE / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_the_check_finds_a_read_of_the_run_config():
    assert cfg_reads("def f(learner):\n    return learner.cfg.sapo.local\n") == [2]
    assert cfg_reads("def f(learner, sapo):\n    return sapo.local\n") == []


def test_no_node_side_module_reads_the_run_config_through_an_attribute():
    files = node_side_files()
    assert len(files) >= 12  # node/ (app, learner, state, warm/...) and the protocols' node sides
    found = {str(f.relative_to(PACKAGE)): lines for f in files if (lines := cfg_reads(f.read_text()))}
    assert found == {}


def test_node_settings_carry_the_run_wide_sections_and_the_task_universe():
    cfg = ExperimentConfig.from_flat({"seed": 7, "num-server-rounds": 3, "tasks.mix": "gcd:1",
                                      "eval.items-per-task": 2, "train.local-steps": 5})
    settings = NodeSettings.of(cfg)
    assert (settings.seed, settings.num_server_rounds, settings.train.local_steps) == (7, 3, 5)
    assert (settings.tasks, settings.eval, settings.strategy) == (cfg.tasks, cfg.eval, cfg.strategy)
    assert [t.name for t in settings.universe.tasks] == ["gcd"]
    assert len(settings.universe.held_out.items) == 2


def test_a_sapo_node_applies_the_section_handed_to_its_constructor(tmp_path):
    cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "tasks.mix": "gcd:1", "tasks.per-node": 0,
                                      "eval.items-per-task": 2, "sapo.completions": 2})
    learner = Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny"))
    item = MixtureStream(list(learner.universe.tasks), learner.universe.tasks, node=5, exclude=set()).take(
        1, StreamCursor())[0]
    packet = Packet("peer", item, (f"<answer>{item.answer}</answer>",) * 9)  # more than 4 x sapo.completions
    with pytest.raises(ValueError, match="packet has 9 completions"):
        SapoNode(learner, cfg.sapo).rescore(packet)
    assert SapoNode(learner, replace(cfg.sapo, completions=3)).rescore(packet) == [1.0] * 9
