"""A run on an existing multi-node Ray cluster (`simulate(..., ray_address=...)`, what `pubswap simulate
--ray-address` and a sweep's `ray-address` do): a head and a worker node of one CPU each, started on this machine
with Ray's own cluster test utilities, get one client actor each; every client records the Ray node it ran on, and
the run's metrics equal the golden single-machine run's.

The cluster lives under its own short temp dir (`RAY_TMPDIR`), so the `ray_current_cluster` file Ray writes for
it cannot make another process's `ray.init()` on this machine join it, and the test stops every process it
started, checked, even when the run fails."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate
from tests.golden.runs import RUNS, comparable, golden_differences

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray-cluster")]  # one worker: one cluster


def _record_ray_node(directory: str, msg, context) -> None:
    """Client hook (runs in the Ray actor): which Ray node served which partition's message."""
    import ray

    entry = {"partition": int(context.node_config["partition-id"]), "type": msg.metadata.message_type,
             "round": int(msg.content["config"]["server-round"]) if "config" in msg.content else None,
             "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
    path = Path(directory) / f"{entry['partition']}-{msg.metadata.message_id}.json"
    path.write_text(json.dumps(entry))


@pytest.fixture(scope="module")
def two_node_cluster():
    """A Ray head and a worker node with one CPU each on this machine, for this module's tests; every process
    they started is stopped afterwards, and checked to be gone."""
    import ray
    from ray.cluster_utils import Cluster

    # Short (Ray's socket paths must stay under 107 characters) and this module's own.
    temp = tempfile.mkdtemp(prefix="pubswap-ray-", dir="/tmp")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", temp)
        env.delenv("RAY_ADDRESS", raising=False)
        cluster = Cluster()
        try:
            head = cluster.add_node(num_cpus=1, include_dashboard=False)
            worker = cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            yield cluster, head, worker
        finally:
            if ray.is_initialized():
                ray.shutdown()
            nodes = [n for n in (cluster.head_node, *cluster.worker_nodes) if n is not None]
            cluster.shutdown()
            left = [process for node in nodes for process in node.live_processes()]
            shutil.rmtree(temp, ignore_errors=True)
            assert not left, f"Ray processes left running: {left}"


def test_a_run_on_a_two_node_ray_cluster_uses_both_nodes_and_repeats_the_golden_metrics(tmp_path, two_node_cluster):
    import torch

    cluster, head, worker = two_node_cluster
    name = "fedavg"
    config, nodes = RUNS[name]
    placements = tmp_path / "placements"
    placements.mkdir()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's evaluation sums in the order the golden run did
    try:
        simulate({**config, "output.dir": str(tmp_path), "run-name": name}, nodes, ray_address=cluster.address,
                 client_hook=functools.partial(_record_ray_node, str(placements)))
    finally:
        torch.set_num_threads(threads)
    served = [json.loads(p.read_text()) for p in placements.iterdir()]
    train = [s for s in served if s["type"] == "train.local_round"]
    assert len(train) == nodes * config["num-server-rounds"]
    by_node = {n: sorted((s["round"], s["partition"]) for s in train if s["node"] == n) for n in
               (head.node_id, worker.node_id)}
    assert {s["node"] for s in served} == set(by_node)
    assert all(by_node.values()), f"a node served no client: {by_node}"
    rows = json.loads(json.dumps(comparable(read_metrics(tmp_path / name))))
    assert golden_differences(name, rows) == []


def _client_actor_nodes(cluster) -> dict[str, str]:
    """Flower client actors the cluster ever ran (dead ones included): actor id -> Ray node id."""
    return {actor_id: info["Address"]["NodeID"] for actor_id, info in cluster.global_state.actor_table(None).items()
            if info["ActorClassName"] == "ClientAppActor"}


def test_a_sweep_with_a_ray_address_runs_its_arms_on_the_cluster(tmp_path, two_node_cluster, monkeypatch):
    """`pubswap compare` with `ray-address` in the sweep file: each arm's `pubswap simulate` process joins the
    cluster, Flower places one client actor on each node, and the arm's metrics are the golden run's."""
    from pubswap_flwr.compare import load_sweep, run_sweep

    cluster, head, worker = two_node_cluster
    config, nodes = RUNS["fedavg"]
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text(f'name = "on-a-cluster"\nnodes = {nodes}\nseeds = [{config["seed"]}]\n'
                          f'ray-address = "{cluster.address}"\n[config]\n'
                          + "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items() if key != "seed")
                          + "[arms.fedavg]\n")
    sweep = load_sweep(sweep_file)
    assert sweep.ray_address == cluster.address
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the arm's process evaluates with one thread, as the golden run did
    before = _client_actor_nodes(cluster)
    (outcome,) = run_sweep(sweep, tmp_path / "out")
    assert outcome.status == "completed", outcome.detail
    actors = {a: n for a, n in _client_actor_nodes(cluster).items() if a not in before}
    assert sorted(actors.values()) == sorted([head.node_id, worker.node_id])
    assert golden_differences("fedavg", comparable(read_metrics(outcome.run_dir))) == []
