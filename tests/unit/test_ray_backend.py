"""Flower's Ray backend config: CPU-only by default; a GPU share per client only where torch sees a GPU; a run of
its own on a local Ray instance, or joining a running Ray cluster by address."""

from __future__ import annotations

import logging

import pytest
import torch

from pubswap_flwr.simulation import check_ray_address, ray_backend_config


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


def test_a_run_of_its_own_starts_a_local_ray_instance_even_where_a_cluster_is_known():
    # "local": neither $RAY_ADDRESS nor the cluster `ray start` last started on this machine is joined by accident
    assert ray_backend_config(total_cpus=2)["init_args"]["address"] == "local"


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head.example.org:6379", "auto", " 127.0.0.1:6380 "])
def test_joining_a_cluster_passes_its_address_and_no_cpu_or_gpu_counts(address):
    config = ray_backend_config(cpus_per_client=2, gpus_per_client=0.5, address=address)
    # Ray refuses num_cpus / num_gpus when joining; the clients' share is still asked per actor
    assert config["init_args"] == {"address": address.strip(), "logging_level": logging.ERROR, "log_to_driver": False}
    assert config["client_resources"] == {"num_cpus": 2, "num_gpus": 0.5}


def test_a_gpu_share_on_a_cluster_does_not_need_a_gpu_on_this_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ray_backend_config(gpus_per_client=0.25, address="10.0.0.5:6379")["client_resources"]["num_gpus"] == 0.25


@pytest.mark.parametrize("address, message", [
    ("10.0.0.5", "is not host:port"), ("10.0.0.5:port", "is not host:port"), (":6379", "is not host:port"),
    ("10.0.0.5:70000", "is not host:port"), ("", "is not host:port"), ("head node:6379", "is not host:port"),
    ("ray://10.0.0.5:10001", "is a URL.*Ray Client"), ("http://10.0.0.5:8265", "is a URL")])
def test_a_bad_cluster_address_is_refused_by_name(address, message):
    with pytest.raises(ValueError, match=message):
        check_ray_address(address)


def test_total_cpus_cannot_be_set_for_a_cluster():
    with pytest.raises(ValueError, match="total cpus cannot be set when joining a Ray cluster"):
        ray_backend_config(total_cpus=4, address="10.0.0.5:6379")
