"""Flower's Ray backend config: CPU-only by default; a GPU share per client only where torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from pubswap_flwr.simulation import ray_backend_config


def test_default_config_gives_clients_no_gpu():
    config = ray_backend_config(cpus_per_client=1, total_cpus=2)
    assert config["client_resources"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert config["init_args"]["num_cpus"] == 2 and config["init_args"]["num_gpus"] == 0


def test_gpu_share_needs_a_visible_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="gpus per client = 0.5 but torch sees no CUDA device"):
        ray_backend_config(gpus_per_client=0.5)


def test_gpu_share_registers_the_visible_gpus_with_ray(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    config = ray_backend_config(gpus_per_client=0.25, total_cpus=16)
    assert config["client_resources"]["num_gpus"] == 0.25
    assert config["init_args"]["num_gpus"] == 2
    with pytest.raises(ValueError, match="gpus per client = 3.0 but only 2 GPU"):
        ray_backend_config(gpus_per_client=3.0)


@pytest.mark.parametrize("cpus, gpus, message", [(0, 0.0, "cpus per client must be > 0"),
                                                 (1, -0.5, "gpus per client must be >= 0")])
def test_bad_resource_values_are_refused(cpus, gpus, message):
    with pytest.raises(ValueError, match=message):
        ray_backend_config(cpus_per_client=cpus, gpus_per_client=gpus)
