"""The thread policy: what each process that runs the model sets torch's thread count to."""

from __future__ import annotations

import logging

import pytest
import torch

from pubswap_flwr.policy import threads
from pubswap_flwr.policy.threads import ThreadChoice, apply_threads, cgroup_cpu_limit, choose_threads


@pytest.mark.parametrize("kwargs,expected", [
    (dict(machine_cpus=2), ThreadChoice(2, "2 CPUs available to this process")),
    (dict(machine_cpus=16, ray_cpus=1.0), ThreadChoice(1, "Ray gave this client 1 CPU")),
    (dict(machine_cpus=16, ray_cpus=0.5), ThreadChoice(1, "Ray gave this client 0.5 CPU")),
    (dict(machine_cpus=16, ray_cpus=2.7), ThreadChoice(2, "Ray gave this client 2.7 CPU")),
    (dict(machine_cpus=16, node_cpus=4, ray_cpus=1.0), ThreadChoice(4, "node-config num-cpus = 4")),
    (dict(setting=3, machine_cpus=16, node_cpus=4, ray_cpus=1.0), ThreadChoice(3, "model.threads = 3")),
    (dict(machine_cpus=8, omp_env="2"), ThreadChoice(2, "OMP_NUM_THREADS = 2")),
    (dict(machine_cpus=8, ray_cpus=1.0, omp_env="4"), ThreadChoice(1, "Ray gave this client 1 CPU")),
    (dict(machine_cpus=8, omp_env="lots"), ThreadChoice(8, "8 CPUs available to this process")),
    (dict(machine_cpus=0), ThreadChoice(1, "0 CPUs available to this process")),
])
def test_choose_threads(kwargs, expected):
    assert choose_threads(**kwargs) == expected


def test_two_clients_on_two_cores_never_ask_for_more_threads_than_cores():
    # Flower's client-resources-num-cpus = 1 on a 2-core machine: two clients run at once
    per_client = [choose_threads(ray_cpus=1.0, machine_cpus=2).threads for _ in range(2)]
    assert sum(per_client) == 2


def test_cgroup_limits(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(tmp_path) is None


def test_apply_sets_torch_and_logs_each_choice_once(monkeypatch, caplog):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_applied", set())
    monkeypatch.setattr(threads, "machine_cpus", lambda: 7)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
            assert apply_threads() == ThreadChoice(7, "7 CPUs available to this process")
            assert torch.get_num_threads() == 7
            apply_threads()
            assert apply_threads(node_cpus=1.5).threads == 1
            assert torch.get_num_threads() == 1
        lines = [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]
        assert lines == ["torch threads: 7 (7 CPUs available to this process)",
                         "torch threads: 1 (node-config num-cpus = 1.5)"]
    finally:
        torch.set_num_threads(before)


def test_node_config_num_cpus_is_checked(tmp_path):
    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.node_runtime.state import NodeIdentity

    cfg = ExperimentConfig.from_flat({})
    identity = NodeIdentity.from_flower(cfg, {"state-dir": str(tmp_path), "num-cpus": "2"}, 5, None, "r")
    assert identity.cpus == 2.0
    assert NodeIdentity.from_flower(cfg, {"state-dir": str(tmp_path)}, 5, None, "r").cpus is None
    for bad in ("two", "0", "-1", "1e9"):
        with pytest.raises(ValueError, match="node-config num-cpus"):
            NodeIdentity.from_flower(cfg, {"state-dir": str(tmp_path), "num-cpus": bad}, 5, None, "r")
