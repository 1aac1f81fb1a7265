"""Server checkpoints: after every round, the fp32 global adapter and the run's state (round, cumulative reward,
node indices, and the protocol's own state such as PubSwap's public-prompt cursor or SAPO's async pool) under
<run dir>/checkpoint, written atomically. Clients' state is already on their disks. `resume = true` continues a
killed run from here.

Layout: `checkpoint/` is the latest round, `checkpoint.prev/` the round before it. A new checkpoint is written to a
temporary directory and swapped in with renames, so a kill at any moment leaves at least one complete checkpoint.
`state.json` records the adapter file's SHA-256 and tensor shapes, and the same for any other adapter the protocol
keeps (`<name>.safetensors`, such as the compressed downlink's H). `load` checks everything it reads (JSON, types,
the config, the adapter's presence for modes that keep one, its hash, keys, shapes and finite values) and raises
`CheckpointError` naming the file; when the latest checkpoint is unusable it falls back to `checkpoint.prev/`
with a logged warning (a node whose round-start snapshot is of the repeated round restarts it from there; one
already a round further goes on from the state it has).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Mapping

import numpy as np
from msgspec import Meta, Struct
from safetensors.numpy import load_file, save_file

from ..config import ConfigError, ExperimentConfig
from ..schema import REWARD_BOUND, RewardTotal, load_json, parse_value_of
from ..tasks.splits import MAX_KNOWN_NODES, MAX_NODES
from ..wire.validate import MAX_ADAPTER_VALUE

log = logging.getLogger("pubswap_flwr")

CHECKPOINT_DIR = "checkpoint"
PREVIOUS_DIR = "checkpoint.prev"
STATE_FILE = "state.json"
ADAPTER_FILE = "global.safetensors"
_TMP_DIR = f".{CHECKPOINT_DIR}.tmp"
_OLD_DIR = f".{CHECKPOINT_DIR}.old"  # the previous checkpoint while it is being replaced (and older versions' swap)
# Keys a resumed run may change: how many rounds in total, the resume flag itself, and where metrics are reported.
# keys a resumed run may change: none changes what the run computes (generation.decode-step: the same tokens and
# log-probs as Hugging Face's forward)
RESUMABLE_CHANGES = {"num-server-rounds", "resume", "output.report-to", "run-claim", "generation.decode-step"}
ADAPTER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")  # a protocol's other adapters: `<name>.safetensors`


def _is_adapter_name(name: str) -> bool:
    """A name a protocol's other adapter may be saved under: plain, and not the global's file."""
    return bool(ADAPTER_NAME.fullmatch(name)) and f"{name}.safetensors" != ADAPTER_FILE


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or inconsistent; the message names the file."""


Shape = Annotated[list[Annotated[int, Meta(ge=0, lt=2**31)]], Meta(max_length=8)]
# \Z, not $: msgspec matches a pattern with re.search, and "$" also matches before a final newline ("7\n")
NodeIdText = Annotated[str, Meta(pattern=r"^[0-9]{1,20}\Z")]


class AdapterManifest(Struct, frozen=True):
    """An adapter file's SHA-256 and tensor shapes, as state.json records them."""

    sha256: Annotated[str, Meta(pattern=r"^[0-9a-f]{64}\Z")]
    shapes: dict[str, Shape]


class CheckpointState(Struct, frozen=True):
    """state.json as `save` writes it; `load_directory` parses it before any of it is used (the rules across fields
    and files are checked there)."""

    round: Annotated[int, Meta(ge=1)]
    config: dict[str, Any]
    cumulative_reward: RewardTotal = 0.0
    # Flower node id (up to 64 bits, as text) -> node index
    node_index: Annotated[dict[NodeIdText, Annotated[int, Meta(ge=0, lt=MAX_NODES)]],
                          Meta(max_length=MAX_KNOWN_NODES)] = {}
    # node index -> the last round its reply was accepted
    node_rounds: Annotated[dict[Annotated[str, Meta(pattern=r"^[0-9]{1,5}\Z")], Annotated[int, Meta(ge=0)]],
                           Meta(max_length=MAX_KNOWN_NODES)] = {}
    protocol: dict[str, Any] = {}
    adapter: AdapterManifest | None = None  # absent in checkpoints of older versions
    adapters: dict[Annotated[str, Meta(pattern=rf"^{ADAPTER_NAME.pattern}\Z")], AdapterManifest] = {}  # not "global"


@dataclass
class ServerCheckpoint:
    round: int
    config: dict
    cumulative_reward: float = 0.0
    node_index: dict[int, int] = field(default_factory=dict)
    node_rounds: dict[int, int] = field(default_factory=dict)  # node index -> the last round its reply was accepted
    protocol: dict = field(default_factory=dict)  # the protocol's JSON-able state (ServerProtocol.state)
    master: dict[str, np.ndarray] | None = None
    adapters: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # ServerProtocol.saved_adapters
    source: Path | None = field(default=None, compare=False)  # the directory it was loaded from

    @property
    def state_path(self) -> Path:
        return (self.source or Path(CHECKPOINT_DIR)) / STATE_FILE

    @property
    def adapter_path(self) -> Path:
        return (self.source or Path(CHECKPOINT_DIR)) / ADAPTER_FILE


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def save(run_dir: Path, checkpoint: ServerCheckpoint) -> None:
    """Write to a temporary directory, then rotate: checkpoint/ -> checkpoint.prev/, the new one -> checkpoint/.
    A kill mid-write or between the renames leaves the previous checkpoints intact."""
    final, previous = run_dir / CHECKPOINT_DIR, run_dir / PREVIOUS_DIR
    tmp, old = run_dir / _TMP_DIR, run_dir / _OLD_DIR
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    state: dict[str, Any] = {
        "round": checkpoint.round, "config": checkpoint.config, "cumulative_reward": checkpoint.cumulative_reward,
        "node_index": {str(k): v for k, v in checkpoint.node_index.items()},
        "node_rounds": {str(k): v for k, v in checkpoint.node_rounds.items()}, "protocol": checkpoint.protocol}
    if checkpoint.master is not None:
        state["adapter"] = _save_tensors(tmp / ADAPTER_FILE, checkpoint.master)
    if checkpoint.adapters:
        state["adapters"] = {}
        for name, tensors in sorted(checkpoint.adapters.items()):
            if not _is_adapter_name(name):
                raise ValueError(f"a checkpointed adapter's name must match {ADAPTER_NAME.pattern} and not be "
                                 f"the global's, got {name!r}")
            state["adapters"][name] = _save_tensors(tmp / f"{name}.safetensors", tensors)
    _write_synced(tmp / STATE_FILE, json.dumps(state).encode("utf-8"))
    if old.exists():
        shutil.rmtree(old)
    if previous.exists():
        os.replace(previous, old)
    if final.exists():
        os.replace(final, previous)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def _save_tensors(path: Path, adapter: Mapping[str, np.ndarray]) -> dict:
    """Write `adapter` as fp32 safetensors; its manifest (SHA-256 and shapes) for state.json."""
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in adapter.items()}
    save_file(tensors, str(path))
    return {"sha256": _sha256(path), "shapes": {k: list(v.shape) for k, v in tensors.items()}}


def load(run_dir: Path) -> ServerCheckpoint | None:
    """The latest usable checkpoint of `run_dir`, or None when it has none at all.

    Tries checkpoint/, then checkpoint.prev/ (and .checkpoint.old/, left by a kill between renames): an unusable
    one is skipped with a warning naming the file and the reason. Raises CheckpointError listing every reason when
    checkpoints exist but none is usable."""
    candidates = [d for d in (run_dir / CHECKPOINT_DIR, run_dir / PREVIOUS_DIR, run_dir / _OLD_DIR) if d.exists()]
    if not candidates:
        return None
    problems: list[str] = []
    for directory in candidates:
        try:
            loaded = load_directory(directory)
        except CheckpointError as err:
            problems.append(str(err))
            log.warning("checkpoint unusable: %s", err)
            continue
        if problems:
            log.warning("resuming from the older checkpoint %s (round %d) instead", directory, loaded.round)
        return loaded
    raise CheckpointError("no usable checkpoint in " + str(run_dir) + ": " + "; ".join(problems))


def load_directory(directory: Path) -> ServerCheckpoint:
    """One checkpoint directory, checked; CheckpointError names the file at fault."""
    state_path = directory / STATE_FILE
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    state = load_json(state_path, CheckpointError)
    saved = parse_value_of(state_path, state, CheckpointState, CheckpointError)

    def bad(key: str, text: str) -> CheckpointError:
        return CheckpointError(f"{state_path}: {key!r} {text}")

    try:
        cfg = ExperimentConfig.from_flat(saved.config)
    except ConfigError as err:
        raise bad("config", f"is not a valid run config: {err}") from err
    number = saved.round
    if number > cfg.num_server_rounds:
        raise bad("round", f"= {number} is beyond the run's num-server-rounds = {cfg.num_server_rounds}")
    # a round adds a mean reward in [0, 1], or within +-REWARD_BOUND with tasks.trl-rewards
    low, high = (-REWARD_BOUND, REWARD_BOUND) if cfg.tasks.trl_rewards else (0.0, 1.0)
    for beyond, word in ((saved.cumulative_reward > number * high + 1e-9, "more"),
                         (saved.cumulative_reward < number * low - 1e-9, "less")):
        if beyond:
            raise bad("cumulative_reward", f"= {_short(saved.cumulative_reward)} is {word} than {number} rounds of "
                                           f"rewards in [{low:g}, {high:g}] add up to")
    nodes = {int(node): index for node, index in saved.node_index.items()}
    if any(node >= 2**64 for node in nodes):
        raise bad("node_index", "maps a node id of more than 64 bits")
    node_rounds = {int(index): done for index, done in saved.node_rounds.items()}
    late = [f"{index}: {done}" for index, done in node_rounds.items() if index >= MAX_NODES or done > number]
    if late:
        raise bad("node_rounds", f"must map node indices < {MAX_NODES} to rounds <= {number}, got {late[0]}")
    protocol = dict(saved.protocol)
    for key in ("public_cursor", "sapo_pool"):  # checkpoints written before protocols kept their own state
        if key in state:
            protocol.setdefault(key, state[key])
    master = _load_adapter(directory, saved.adapter, cfg)
    adapters = _load_other_adapters(directory, saved.adapters, master)
    _check_protocol(cfg, protocol, adapters, nodes, bad)
    return ServerCheckpoint(round=number, config=dict(saved.config), cumulative_reward=saved.cumulative_reward,
                            node_index=nodes, node_rounds=node_rounds, protocol=protocol, master=master,
                            adapters=adapters, source=directory)


def _short(value: Any) -> str:
    """A value for an error message: a number of 5000 digits is not worth printing."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} chars)"


def _check_protocol(cfg: ExperimentConfig, protocol: dict, adapters: dict, nodes: dict[int, int], bad) -> None:
    """The protocol's state restores (a trial restore into a fresh protocol of the saved config), so a checkpoint
    whose state a resumed run would refuse is skipped here, where the previous one can still be used."""
    from ..protocols import protocol_class

    try:
        protocol_class(cfg.strategy.mode).from_config(cfg).restore(protocol, adapters, nodes)
    except (KeyError, TypeError, ValueError) as err:
        raise bad("protocol", f"state cannot be restored ({type(err).__name__}: {str(err)[:300]})") from err


def _load_adapter(directory: Path, manifest: AdapterManifest | None, cfg: ExperimentConfig
                  ) -> dict[str, np.ndarray] | None:
    """The global adapter when the saved config's mode keeps one (asked of the protocol registry), checked against
    the SHA-256 and shapes state.json recorded (checkpoints of older versions recorded none) and for finite
    values."""
    from ..protocols import protocol_class

    path, state_path = directory / ADAPTER_FILE, directory / STATE_FILE
    mode = cfg.strategy.mode
    if not protocol_class(mode).holds_global_adapter:
        if path.exists():
            raise CheckpointError(f"{path}: unexpected; strategy.mode = {mode!r} keeps no global adapter")
        return None
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; strategy.mode = {mode!r} needs the global adapter")
    return _read_tensors(path, manifest, state_path)


def _load_other_adapters(directory: Path, listed: dict[str, AdapterManifest], master: dict[str, np.ndarray] | None
                         ) -> dict[str, dict[str, np.ndarray]]:
    """The protocol's other adapters listed under state.json's 'adapters', each checked like the global and
    against its keys and shapes."""
    state_path = directory / STATE_FILE
    adapters = {}
    for name, manifest in listed.items():
        if not _is_adapter_name(name):
            raise CheckpointError(f"{state_path}: 'adapters' names {name!r}, not an adapter name")
        path = directory / f"{name}.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing; {state_path} lists it")
        tensors = _read_tensors(path, manifest, state_path)
        if master is not None:
            check_adapter_shapes(path, tensors, {k: v.shape for k, v in master.items()}, against="the global's")
        adapters[name] = tensors
    return adapters


def _read_tensors(path: Path, manifest: AdapterManifest | None, state_path: Path) -> dict[str, np.ndarray]:
    """A safetensors adapter, checked against its state.json manifest (SHA-256 and shapes; checkpoints of older
    versions recorded none for the global) and for float, finite values within MAX_ADAPTER_VALUE."""
    if manifest is not None and _sha256(path) != manifest.sha256:
        raise CheckpointError(f"{path}: content does not match the SHA-256 recorded in {state_path} "
                              "(truncated or overwritten)")
    try:
        tensors = load_file(str(path))
    except Exception as err:  # safetensors raises its own error type, or OSError / ValueError
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors")
    if manifest is not None:
        check_adapter_shapes(path, tensors, manifest.shapes)
    for key, tensor in tensors.items():
        if not np.issubdtype(tensor.dtype, np.floating):
            raise CheckpointError(f"{path}: tensor {key} has dtype {tensor.dtype}, expected float32")
        if not np.isfinite(tensor).all():
            raise CheckpointError(f"{path}: tensor {key} holds non-finite values (NaN or inf)")
        largest = float(np.abs(tensor).max()) if tensor.size else 0.0
        if largest > MAX_ADAPTER_VALUE:  # what the server accepts from a client (validate.check_adapter)
            raise CheckpointError(f"{path}: tensor {key} has a value of magnitude {largest:.3g}, over the "
                                  f"{MAX_ADAPTER_VALUE:g} an adapter may hold")
    return {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}


def check_adapter_shapes(path: Path, tensors: Mapping[str, Any], expected: Mapping[str, Any],
                         against: str = "the model's") -> None:
    """`tensors` have exactly the keys of `expected` (key -> shape) and those shapes; CheckpointError names `path`
    and the first few differing keys."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{path}: adapter keys differ from {against}: missing {missing[:3]}"
                              f"{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                              f"{' ...' if len(unexpected) > 3 else ''}")
    for key, want in expected.items():
        shape = tuple(np.shape(tensors[key]))
        want = tuple(want) if isinstance(want, (list, tuple)) else tuple(np.shape(want))
        if shape != want:
            raise CheckpointError(f"{path}: adapter tensor {key} has shape {shape}, expected {want}")


def check_adapter(saved: ServerCheckpoint, model_adapter: Mapping[str, Any]) -> None:
    """The checkpoint's global adapter fits the model (same keys and shapes as `model_adapter`)."""
    if saved.master is None:
        raise CheckpointError(f"{saved.adapter_path}: missing; the run needs a global adapter")
    check_adapter_shapes(saved.adapter_path, saved.master,
                         {k: tuple(np.shape(v)) for k, v in model_adapter.items()})


# keys whose default changed after they were added: a checkpoint written before they existed ran with these values
FIRST_DEFAULTS = {"tasks.partial-credit": True, "train.update-dtype": "float32"}


def check_compatible(checkpoint: ServerCheckpoint, cfg: ExperimentConfig) -> None:
    """A resumed run must use the checkpointed config (only the round count may grow)."""
    now = cfg.to_flat()
    # a key added after the checkpoint was written had its first default then
    defaults = {**ExperimentConfig().to_flat(), **FIRST_DEFAULTS}
    changed = sorted(k for k in set(now) | set(checkpoint.config)
                     if k not in RESUMABLE_CHANGES and now.get(k) != checkpoint.config.get(k, defaults.get(k)))
    if changed:
        was = "; ".join(f"{k} = {checkpoint.config.get(k, defaults.get(k))!r} in the checkpoint, {now.get(k)!r} now"
                        for k in changed)
        raise ConfigError(f"cannot resume with a different config; changed keys: {', '.join(changed)} ({was}: set "
                          f"them as the checkpoint has them to resume)")
    if cfg.num_server_rounds < checkpoint.round:
        raise ConfigError(f"num-server-rounds = {cfg.num_server_rounds} is below the checkpointed round "
                          f"{checkpoint.round}")
