"""Where a node keeps its state and what it trains on, in simulation and in deployment."""

from __future__ import annotations

from pathlib import Path

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.state import NodeIdentity

CFG = ExperimentConfig.from_flat({"strategy.mode": "sapo", "model.node-models": "embedded:tiny,embedded:tiny-b",
                                  "tasks.data-paths": "a.jsonl,b.jsonl,c.jsonl"})


def test_simulated_node_keeps_state_under_the_run_dir_and_takes_round_robin_assignments():
    node = NodeIdentity.from_flower(CFG, {"partition-id": 4, "num-partitions": 5}, 123, "/runs/x", "x")
    assert node.index == 4 and node.state_dir == Path("/runs/x/nodes/partition-4")
    assert node.model_name == "embedded:tiny" and node.data_path == "b.jsonl"


def test_deployed_node_uses_its_state_dir_and_node_config(tmp_path):
    config = {"state-dir": str(tmp_path), "data-path": "/org/private.jsonl", "model-name": "/models/m",
              "task-mix": "gcd:1", "partition-id": 2}
    node = NodeIdentity.from_flower(CFG, config, 987654321, "/server/side/path", "run-7")
    assert node.state_dir == tmp_path.resolve() / "run-7"
    assert (node.index, node.model_name, node.data_path, node.task_mix) == (2, "/models/m", "/org/private.jsonl",
                                                                             "gcd:1")


def test_deployed_node_without_state_dir_never_uses_the_servers_run_dir():
    node = NodeIdentity.from_flower(CFG, {"partition-id": 1}, 55, "/server/side/path", "run-7")
    assert node.state_dir == Path.home() / ".pubswap" / "state" / "run-7" / "node-55"
    assert NodeIdentity.from_flower(CFG, {}, 10_007, None, "r").index == 7  # node id modulo MAX_NODES


def test_learning_rates_go_to_partitions_round_robin_and_node_config_overrides_them():
    import pytest

    from pubswap_flwr.config import ConfigError
    from pubswap_flwr.export import run_summary
    from pubswap_flwr.shared import policy_spec

    cfg = CFG.with_overrides({"train.node-learning-rates": "2e-4, 2e-3", "train.learning-rate": 1e-3})
    simulated = [NodeIdentity.from_flower(cfg, {"partition-id": i, "num-partitions": 4}, i, "/r", "r")
                 for i in range(4)]
    assert [(n.model_name, n.learning_rate) for n in simulated] == [
        ("embedded:tiny", 2e-4), ("embedded:tiny-b", 2e-3), ("embedded:tiny", 2e-4), ("embedded:tiny-b", 2e-3)]
    deployed = NodeIdentity.from_flower(cfg, {"partition-id": 0, "learning-rate": "5e-4"}, 1, None, "r")
    assert deployed.learning_rate == 5e-4
    assert NodeIdentity.from_flower(CFG, {"partition-id": 0}, 1, None, "r").learning_rate is None
    with pytest.raises(ValueError, match="node learning-rate = 'fast': must be a number"):
        NodeIdentity.from_flower(CFG, {"learning-rate": "fast"}, 1, None, "r")
    with pytest.raises(ValueError, match="must be > 0 and <= 10"):
        NodeIdentity.from_flower(CFG, {"learning-rate": -1}, 1, None, "r")
    for bad in ("2e-4,x", "0", "2e-4,,1e-3", "1e-3,11"):
        with pytest.raises(ConfigError, match="train.node-learning-rates = .*each > 0 and <= 10"):
            CFG.with_overrides({"train.node-learning-rates": bad})
    with pytest.raises(ConfigError, match="train.node-learning-rates = 0.1: must be a string"):
        CFG.with_overrides({"train.node-learning-rates": 0.1})

    # the node's rate reaches its optimizer settings and its adapter card; the evaluator keeps the run's
    spec = policy_spec(cfg, simulated[1].model_name, learning_rate=simulated[1].learning_rate)
    assert spec.grpo.learning_rate == 2e-3 and policy_spec(cfg).grpo.learning_rate == 1e-3
    card = run_summary(cfg, 3, node="partition-1", spec=spec)
    assert (card["base_model"], card["grpo"]["learning-rate"]) == ("embedded:tiny-b", 2e-3)
    assert run_summary(cfg, 3)["base_model"] == cfg.model.name
