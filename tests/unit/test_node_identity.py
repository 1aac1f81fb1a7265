"""Where a node keeps its state and what it trains on, in simulation and in deployment."""

from __future__ import annotations

from pathlib import Path

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_state import NodeIdentity

CFG = ExperimentConfig.from_flat({"model.node-models": "embedded:tiny,embedded:tiny-b",
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
