"""The warm worker of a deployed node (pubswap_flwr/node/warm), with real worker processes: a PubSwap run gives the same
metrics, adapters and node state as the per-message path, a worker SIGKILLed between messages is started again and
loses nothing, and the socket is owner-only. Nodes are served through the in-process grid with deployed node configs
(no `num-partitions`, a `state-dir` each), so the ClientApp routes exactly as on a SuperNode."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pubswap_flwr.inprocess import InProcessGrid, server_context
from pubswap_flwr.node.app import build_client_app
from pubswap_flwr.node.warm.client import RUNTIME_DIR_ENV
from pubswap_flwr.node.warm.worker import process_alive
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import build_apps
from tests.golden.runs import comparable

pytestmark = pytest.mark.slow

NODES = 2
CONFIG = {"seed": 4, "num-server-rounds": 2, "strategy.mode": "pubswap", "train.local-steps": 2,
          "pubswap.tau-swap": 1, "pubswap.public-prompts": 2, "train.prompts-per-step": 2,
          "train.completions-per-prompt": 4, "eval.items-per-task": 4, "deploy.worker-idle-timeout": 120.0,
          "strategy.apply-below-robust": True}  # 2 nodes: apply their rounds (#54 keeps them by default)


def _worker_pids(directory: Path) -> list[int]:
    """The live workers (a SIGKILLed one leaves its pid file behind)."""
    return [pid for pid in (int(p.read_text()) for p in directory.glob("*.pid")) if process_alive(pid)]


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.fixture()
def worker_dir(tmp_path_factory, monkeypatch):
    directory = tmp_path_factory.mktemp("w")
    directory.chmod(0o700)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(directory))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers sum floats in the same order as this process
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield directory
    torch.set_num_threads(threads)
    _kill(_worker_pids(directory), signal.SIGTERM)


def _run(out: Path, warm: bool, deliver=None) -> Path:
    """One run with deployed nodes; returns its run dir (node state under out/state/node-N/<run-name>)."""
    config = {**CONFIG, "output.dir": str(out), "run-name": "run", "deploy.warm-worker": warm}
    server, _ = build_apps(config, settle_seconds=0.0)
    grid = InProcessGrid(build_client_app(), NODES, config, deliver=deliver,
                         extra_node_config=lambda n: {"state-dir": str(out / "state" / f"node-{n}")})
    for node in grid.nodes.values():
        del node.context.node_config["num-partitions"]  # what a SuperNode's node config looks like
    server(grid, server_context(grid))
    return out / "run"


def _node_files(out: Path) -> dict[str, object]:
    files: dict[str, object] = {}
    for n in range(NODES):
        state = out / "state" / f"node-{n}" / "run"
        files[f"{n}/node.json"] = json.loads((state / "node.json").read_text())
        files[f"{n}/adapter"] = load_file(str(state / "adapter.safetensors"))
    return files


def _same_files(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key.endswith("adapter"):
            assert a[key].keys() == b[key].keys()
            for name in a[key]:
                assert torch.equal(a[key][name], b[key][name]), (key, name)
        else:
            assert a[key] == b[key], key


def test_warm_worker_gives_the_per_message_results_and_survives_being_killed(tmp_path, worker_dir):
    per_message = _run(tmp_path / "cold", warm=False)
    assert not list(worker_dir.glob("*.sock")), "the per-message path started a worker"

    # One warm run: the workers serve most messages; SIGKILL every worker before the 1st, 4th and 7th message: each
    # is started again and continues from disk (a run of warm workers never killed repeated these results too)
    served = []
    killed = []

    def kill_then_call(message, context, call):
        served.append(message.metadata.message_type)
        if len(served) in (1, 4, 7):
            pids = _worker_pids(worker_dir)
            _kill(pids, signal.SIGKILL)
            killed.extend(pids)
        return call(message, context)

    warm = _run(tmp_path / "warm", warm=True, deliver=kill_then_call)
    assert len(served) > 7  # messages were served by workers that no kill followed
    assert len(killed) >= 2 * NODES, "the 4th and 7th messages found every node's worker to kill"
    live = _worker_pids(worker_dir)
    assert len(live) == NODES and not set(live) & set(killed), "the killed workers were replaced, one per node"
    sockets = list(worker_dir.glob("*.sock"))
    assert len(sockets) == NODES, "one worker per node"
    assert stat.S_IMODE(worker_dir.stat().st_mode) == 0o700
    for path in sockets:
        info = path.stat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()

    rows = read_metrics(warm)
    assert all(not r.get("dropped") for r in rows)
    assert comparable(rows) == comparable(read_metrics(per_message))
    _same_files(_node_files(tmp_path / "warm"), _node_files(tmp_path / "cold"))
