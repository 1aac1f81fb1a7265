"""Server checkpoints: after every round, the fp32 global adapter and the run's state (round, cumulative reward,
node indices, and the protocol's own state such as PubSwap's public-prompt cursor or SAPO's async pool) under
<run dir>/checkpoint, written atomically. Clients' state is already on their disks. `resume = true` continues a
killed run from here."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from .config import ConfigError, ExperimentConfig

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"
ADAPTER_FILE = "global.safetensors"
# Keys a resumed run may change: how many rounds in total, and the resume flag itself.
RESUMABLE_CHANGES = {"num-server-rounds", "resume"}


@dataclass
class ServerCheckpoint:
    round: int
    config: dict
    cumulative_reward: float = 0.0
    node_index: dict[int, int] = field(default_factory=dict)
    protocol: dict = field(default_factory=dict)  # the protocol's JSON-able state (ServerProtocol.state)
    master: dict[str, np.ndarray] | None = None


def save(run_dir: Path, checkpoint: ServerCheckpoint) -> None:
    """Write to a temporary directory, then swap it in: a kill mid-write leaves the previous checkpoint intact."""
    final = run_dir / CHECKPOINT_DIR
    tmp = run_dir / f".{CHECKPOINT_DIR}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    state = {"round": checkpoint.round, "config": checkpoint.config, "cumulative_reward": checkpoint.cumulative_reward,
             "node_index": {str(k): v for k, v in checkpoint.node_index.items()}, "protocol": checkpoint.protocol}
    (tmp / STATE_FILE).write_text(json.dumps(state))
    if checkpoint.master is not None:
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in checkpoint.master.items()},
                  str(tmp / ADAPTER_FILE))
    old = run_dir / f".{CHECKPOINT_DIR}.old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def load(run_dir: Path) -> ServerCheckpoint | None:
    directory = run_dir / CHECKPOINT_DIR
    if not (directory / STATE_FILE).is_file():
        old = run_dir / f".{CHECKPOINT_DIR}.old"  # killed between the two renames
        if not (old / STATE_FILE).is_file():
            return None
        directory = old
    state = json.loads((directory / STATE_FILE).read_text())
    master = load_file(str(directory / ADAPTER_FILE)) if (directory / ADAPTER_FILE).is_file() else None
    protocol = dict(state.get("protocol", {}))
    for key in ("public_cursor", "sapo_pool"):  # checkpoints written before protocols kept their own state
        if key in state:
            protocol.setdefault(key, state[key])
    return ServerCheckpoint(round=int(state["round"]), config=dict(state["config"]),
                            cumulative_reward=float(state.get("cumulative_reward", 0.0)),
                            node_index={int(k): int(v) for k, v in state.get("node_index", {}).items()},
                            protocol=protocol, master=master)


def check_compatible(checkpoint: ServerCheckpoint, cfg: ExperimentConfig) -> None:
    """A resumed run must use the checkpointed config (only the round count may grow)."""
    now = cfg.to_flat()
    changed = sorted(k for k in set(now) | set(checkpoint.config)
                     if k not in RESUMABLE_CHANGES and now.get(k) != checkpoint.config.get(k))
    if changed:
        raise ConfigError(f"cannot resume with a different config; changed keys: {', '.join(changed)}")
    if cfg.num_server_rounds < checkpoint.round:
        raise ConfigError(f"num-server-rounds = {cfg.num_server_rounds} is below the checkpointed round "
                          f"{checkpoint.round}")
