"""A node's identity and its state on local disk (adapter, optimizer, stream cursor, counters, round-start snapshot).

Deployed ClientApps are a new process per message and `context.state` is memory-only, so everything a node needs
to continue lives under its state dir, written atomically (temp file + rename). Its files are read as untrusted:
only a missing file means a fresh start; anything else at a state file's name that is no regular file (a link, a
folder, a FIFO, a device) is an error naming it, never followed, opened or taken for a fresh node.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import torch
from msgspec import Meta, Struct
from safetensors import SafetensorError
from safetensors.numpy import load as load_numpy
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load, save_file

from ..config import ExperimentConfig
from ..config.keys import PLAIN_COMPONENT, is_plain_component
from ..config.sections import MAX_LEARNING_RATE
from ..policy import Policy
from ..schema import RewardTotal, decode_json, parse, parse_value_of
from ..tasks import StreamCursor
from ..tasks.curriculum import TaskLevel
from ..tasks.splits import MAX_NODES, MAX_TASKS
from ..untrusted import MAX_FILE_BYTES, UntrustedFileError, one_line, read_bytes, write_replacing

STATE_FILE = "node.json"
ADAPTER_FILE = "adapter.safetensors"
REFERENCE_FILE = "proximal-reference.safetensors"  # FedProx: the last global adapter (kept across messages)
OPTIMIZER_FILE = "optimizer.safetensors"  # Adam moments; parameter groups in its metadata
OLD_OPTIMIZER_FILE = "optimizer.pt"  # before 2026-12-03: read when no OPTIMIZER_FILE exists
OPTIMIZER_GROUPS = "param_groups"
ROUND_START_DIR = "round-start"
ROUND_MARKER = "round"  # in ROUND_START_DIR: the round the snapshot starts
MARKER_BYTES = 64
FILES = (STATE_FILE, ADAPTER_FILE, OPTIMIZER_FILE)
GLOBAL_FILE = "global.safetensors"  # strategy.compression: the global the node holds (the base of deltas)
RESIDUAL_FILE = "residual.safetensors"  # strategy.compression: what quantization lost (error feedback)
OPTIONAL_FILES = (GLOBAL_FILE, RESIDUAL_FILE)  # in the round-start snapshot when present


@dataclass(frozen=True)
class NodeIdentity:
    """Who this node is: its index (seed ranges, default task mix), state dir, model and private data."""

    index: int
    state_dir: Path
    model_name: str
    data_path: str | None = None
    task_mix: str | None = None
    simulated: bool = False  # a simulated node (Flower set num-partitions): its state lives under the run dir
    cpus: float | None = None  # deployment: node-config num-cpus, the CPUs its organization gives the model
    learning_rate: float | None = None  # None: the run's train.learning-rate

    @classmethod
    def from_flower(cls, cfg: ExperimentConfig, node_config: dict, node_id: int, run_dir: str | None,
                    run_name: str) -> "NodeIdentity":
        """Simulation: partition-id from Flower, state under the run dir. Deployment: node-config keys
        `state-dir`, `data-path`, `model-name`, `task-mix`, optional `partition-id`, `learning-rate`."""
        run_name = safe_component(run_name, "run-name")
        partition = node_config.get("partition-id")
        index = _node_index(partition) if partition is not None else int(node_id) % MAX_NODES
        simulated = "num-partitions" in node_config  # Flower sets it only for simulated nodes
        if node_config.get("state-dir"):
            state_dir = Path(str(node_config["state-dir"])).expanduser().resolve() / run_name
        elif run_dir and simulated:
            state_dir = Path(run_dir) / "nodes" / f"partition-{index}"
        else:
            state_dir = Path.home() / ".pubswap" / "state" / run_name / f"node-{node_id}"
        model = node_config.get("model-name") or _round_robin(cfg.model.node_models, index) or cfg.model.name
        data_path = node_config.get("data-path") or _round_robin(cfg.tasks.data_paths, index)
        rate = node_config.get("learning-rate")  # 0 or false is a rate to refuse, not an unset one
        if rate is None or rate == "":
            rate = _round_robin(cfg.train.node_learning_rates, index)
        cpus = _positive_number(node_config.get("num-cpus"), "node-config num-cpus", 4096, "a number of CPUs")
        return cls(index, state_dir, str(model), str(data_path) if data_path else None,
                   node_config.get("task-mix") or None, simulated, cpus,
                   _positive_number(rate, "node learning-rate", MAX_LEARNING_RATE))


def safe_component(name: str, what: str) -> str:
    """`name` if it is one plain path component: a run name from the server must never move a node's state
    outside its state dir (the server's config check uses the same rule: config.is_plain_component)."""
    if not is_plain_component(name):
        raise ValueError(f"{what} {name!r} is not {PLAIN_COMPONENT}")
    return name


def _node_index(value) -> int:
    """node-config partition-id as a node index in [0, MAX_NODES): an integer (or its digits, or an integral
    float); anything else is one clear error (a node of index -1 or 1e9 had every reply dropped by the server)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_NODES:
        raise ValueError(f"node-config partition-id = {value!r}: must be an integer >= 0 and < {MAX_NODES}")
    return value


def _positive_number(value, name: str, high: float, what: str = "a number") -> float | None:
    """A node setting as a number in (0, high], None when unset; a clear error naming `name` otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):  # float(False) is 0.0 and float(True) 1.0: neither was meant as a number
        raise ValueError(f"{name} = {value!r}: must be {what}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {value!r}: must be {what}") from None
    if not 0 < number <= high:
        raise ValueError(f"{name} = {value!r}: must be > 0 and <= {high:g}")
    return number


def _round_robin(text: str, index: int) -> str | None:
    """Entry `index` (modulo length) of a comma-separated run-config list, or None when the list is empty."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names[index % len(names)] if names else None


Tally = Annotated[int, Meta(ge=0)]


class NodeState(Struct):
    """Small JSON-able node state (node.json); tensors live in their own files next to it. Declared in the schema
    layer's way: a state dir is a file another hand may have touched, so it is parsed, never coerced."""

    model_name: str = ""
    rounds: Tally = 0
    steps: Tally = 0
    sample_calls: Tally = 0
    cumulative_reward: RewardTotal = 0.0  # one mean reward per round
    last_round: Tally = 0
    cursor: StreamCursor = msgspec.field(default_factory=StreamCursor)
    # tasks.curriculum: the node's curriculum level and recent group successes per task (tasks/curriculum.py)
    curriculum: Annotated[dict[Annotated[str, Meta(max_length=256)], TaskLevel], Meta(max_length=MAX_TASKS)] = \
        msgspec.field(default_factory=dict)
    # train.skip-equal-prompts: per task, its latest private groups in a row whose rewards all agreed
    equal_streaks: dict[str, Tally] = msgspec.field(default_factory=dict)
    # the mode family's own state (pubswap's pending public samples, SAPO's pending groups and peer record), as that
    # family declares it (catalog: node_state) and Learner.family_state parses it
    mode: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict:
        return msgspec.to_builtins(self, enc_hook=plain)

    @classmethod
    def from_dict(cls, data: Any) -> "NodeState":
        return parse(data, cls, "node state", ValueError)


def plain(value: Any) -> Any:
    """A numpy scalar (reasoning-gym metadata in a pending SAPO group's item) as the Python number it holds."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"node state cannot hold a {type(value).__name__}")


def with_family_state(saved: Any) -> Any:
    """A node.json written before each mode family kept its own state (2026-12-04): its pubswap or SAPO keys moved
    into `mode` as that family declares them, so a run resumed across the change keeps them (SAPO's peer record
    decides which external groups a node picks under sapo.reputation). Anything else is returned as it is."""
    if not isinstance(saved, dict) or "mode" in saved:
        return saved
    old = {key: saved[key] for key in ("pending_public", "pending_sapo", "peers") if key in saved}
    rest = {key: value for key, value in saved.items() if key not in old}
    if old.get("pending_public"):
        return {**rest, "mode": {"pending": old["pending_public"]}}
    if old.get("pending_sapo") or old.get("peers"):
        return {**rest, "mode": {"pending": old.get("pending_sapo") or [], "peers": old.get("peers") or {}}}
    return rest


def _what_is(path: Path, mode: int) -> str:
    """What is at `path`, from its lstat mode, for an error message."""
    if stat.S_ISLNK(mode):
        try:
            return f"a link (to {one_line(os.readlink(path))})"
        except OSError:
            return "a link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a regular file"


def _saved(path: Path, folder: bool = False) -> bool:
    """Whether the node saved `path` (a regular file, or with `folder` a folder): False when nothing is there (a
    fresh start), UntrustedFileError naming it and what it is for anything else there, found without following a
    link or opening a FIFO."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as err:
        raise UntrustedFileError(f"{path}: cannot be read ({err.strerror})") from None
    if (stat.S_ISDIR if folder else stat.S_ISREG)(mode):
        return True
    raise UntrustedFileError(f"{path}: {_what_is(path, mode)}, not {'a folder' if folder else 'a regular file'}; "
                             "a node's state is read only from the regular files it wrote (links are not followed): "
                             "move the state dir away to start this node over")


def _read(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The content of the state file `path` (missing: UntrustedFileError, as for anything not a regular file)."""
    _saved(path)
    return read_bytes(path, limit=limit)


def _round_marker(path: Path) -> int:
    """The round number in a round-start marker; UntrustedFileError naming the file and the value otherwise."""
    text = _read(path, MARKER_BYTES).decode("utf-8", errors="replace")
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise UntrustedFileError(f"{path}: round marker {text!r} is not a round number")
    return int(value)


def _metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file's header (`data` already loaded: the header is well formed)."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__") or {}


class NodeStore:
    """Reads and writes one node's state dir: the JSON state, the adapter and the optimizer moments."""

    def __init__(self, directory: Path, model_name: str):
        self.directory = directory
        self.model_name = model_name
        directory.mkdir(parents=True, exist_ok=True)

    def load(self, policy: Policy) -> NodeState:
        """The saved state, with the saved adapter and optimizer loaded into `policy` (a fresh state if none)."""
        path = self.directory / STATE_FILE
        if not _saved(path):
            return NodeState(model_name=self.model_name)
        state = parse_value_of(path, with_family_state(decode_json(_read(path), path, ValueError)), NodeState,
                               ValueError)
        if state.model_name and state.model_name != self.model_name:
            raise ValueError(f"state dir {self.directory} belongs to model {state.model_name!r}, "
                             f"not {self.model_name!r}; use another state-dir or run-name")
        if _saved(self.directory / ADAPTER_FILE):
            policy.load_adapter(load(_read(self.directory / ADAPTER_FILE)))
        if _saved(self.directory / OPTIMIZER_FILE):
            self._load_optimizer(policy, self.directory / OPTIMIZER_FILE)
        elif _saved(self.directory / OLD_OPTIMIZER_FILE):  # weights_only: no code runs from the file
            old = io.BytesIO(_read(self.directory / OLD_OPTIMIZER_FILE))
            policy.learner.optimizer.load_state_dict(torch.load(old, weights_only=True))
        return state

    def save(self, policy: Policy, state: NodeState) -> None:
        """Write adapter, optimizer and state atomically (temp file + rename), so a crash never leaves half."""
        tmp = self.directory / f".{ADAPTER_FILE}.tmp"
        save_file(policy.adapter(), str(tmp))
        os.replace(tmp, self.directory / ADAPTER_FILE)
        tmp = self.directory / f".{OPTIMIZER_FILE}.tmp"
        moments, groups = policy.learner.optimizer_tensors()
        save_file(moments, str(tmp), metadata={OPTIMIZER_GROUPS: groups})
        os.replace(tmp, self.directory / OPTIMIZER_FILE)
        (self.directory / OLD_OPTIMIZER_FILE).unlink(missing_ok=True)  # never read beside the new file again
        tmp = self.directory / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state.to_dict()))
        os.replace(tmp, self.directory / STATE_FILE)

    @staticmethod
    def _load_optimizer(policy: Policy, path: Path) -> None:
        data = _read(path)
        try:
            moments = dict(sorted(load(data).items()))  # by name, as the file lists them (load's order varies)
        except SafetensorError as err:
            raise ValueError(f"{path} is not a safetensors file ({err})") from None
        groups = _metadata(data).get(OPTIMIZER_GROUPS)
        if groups is None:
            raise ValueError(f"{path} has no {OPTIMIZER_GROUPS} metadata: not an optimizer state this code wrote")
        try:
            policy.learner.load_optimizer_tensors(moments, groups)
        except ValueError as err:  # json.JSONDecodeError is one too
            raise ValueError(f"{path}: {err}") from None

    def save_reference(self, reference: dict[str, torch.Tensor]) -> None:
        tmp = self.directory / f".{REFERENCE_FILE}.tmp"
        save_file({k: v.detach().cpu().contiguous() for k, v in reference.items()}, str(tmp))
        os.replace(tmp, self.directory / REFERENCE_FILE)

    def load_reference(self) -> dict[str, torch.Tensor] | None:
        path = self.directory / REFERENCE_FILE
        return load(_read(path)) if _saved(path) else None

    def save_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """float32 arrays under `name` in the state dir, written atomically (compression's global and residual)."""
        tmp = self.directory / f".{name}.tmp"
        save_numpy({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}, str(tmp))
        os.replace(tmp, self.directory / name)

    def load_arrays(self, name: str) -> dict[str, np.ndarray] | None:
        path = self.directory / name
        return load_numpy(_read(path)) if _saved(path) else None

    def has_round_start(self, round_number: int) -> bool:
        snapshot = self.directory / ROUND_START_DIR
        if not _saved(snapshot, folder=True) or not _saved(snapshot / ROUND_MARKER):
            return False
        return _round_marker(snapshot / ROUND_MARKER) == round_number

    def restore_round_start(self) -> None:
        """Put the state saved at the start of the round back in place (the caller reloads it); every file of the
        snapshot is read before any is put back, so one that cannot be read changes nothing."""
        snapshot = self.directory / ROUND_START_DIR
        _saved(snapshot, folder=True)
        names = (STATE_FILE, ADAPTER_FILE, OPTIMIZER_FILE, OLD_OPTIMIZER_FILE, *OPTIONAL_FILES)
        saved = {name: _read(snapshot / name) for name in names if _saved(snapshot / name)}
        for name in (STATE_FILE, ADAPTER_FILE):
            if name in saved:
                write_replacing(self.directory / name, saved[name])
        # what the snapshot lacks goes too: a snapshot from before the safetensors moments holds optimizer.pt, and
        # it, not the moments saved mid-round in the new file, is the round's start
        for name in (OPTIMIZER_FILE, OLD_OPTIMIZER_FILE, *OPTIONAL_FILES):
            if name in saved:
                write_replacing(self.directory / name, saved[name])
            else:
                (self.directory / name).unlink(missing_ok=True)

    def snapshot_round_start(self, round_number: int) -> None:
        """Copy the saved state as round `round_number`'s starting point (swapped in whole)."""
        snapshot = self.directory / ROUND_START_DIR
        tmp = self.directory / f".{ROUND_START_DIR}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name in FILES + tuple(name for name in OPTIONAL_FILES if _saved(self.directory / name)):
            (tmp / name).write_bytes(_read(self.directory / name))
        (tmp / ROUND_MARKER).write_text(str(round_number))
        if snapshot.exists():
            shutil.rmtree(snapshot)
        os.replace(tmp, snapshot)
