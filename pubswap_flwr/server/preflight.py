"""Checks made before Flower or Ray start (`pubswap run | simulate`) and first thing in the ServerApp: the config
(every key and value) and the run directory (a new run must not reuse one; a resumed run needs its checkpoint).

Light on purpose: importing this module (and the CLI that calls it) loads neither Flower, Ray nor torch, so a bad
config fails in a moment with one line instead of after the simulation engine started.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..config import ConfigError, ExperimentConfig, flatten, load_toml, parse_overrides
from . import checkpoint, trackers
from .checkpoint import CheckpointError
from .metrics import RunExistsError, read_status, refuse_existing_run

log = logging.getLogger(__name__)

# What a preflight check raises for a problem the user can fix; anything else is a bug and keeps its traceback.
# FileNotFoundError: a -c file that does not exist, or resume = true without a checkpoint.
PROBLEMS = (ConfigError, RunExistsError, CheckpointError, FileNotFoundError)

# One `-c` argument holds key=value pairs separated by spaces, as `flwr run -c` takes them (its own pattern: a value
# is a quoted string or runs to the next space).
_PAIR = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")


@dataclass(frozen=True)
class Checked:
    """A config that passed, its run directory (None when Flower's run id names it), the checkpoint a resumed
    run continues from, and why there is nothing to run (a resumed run that had already completed)."""

    config: ExperimentConfig
    run_dir: Path | None
    saved: checkpoint.ServerCheckpoint | None = None
    finished: str | None = None


def one_line(err: BaseException) -> str:
    """The error as one line (a TOML parser's message may span several)."""
    return " ".join(str(err).split())


def read_overrides(values: Iterable[str]) -> dict[str, Any]:
    """Flat overrides from `-c` values applied in order: a TOML file (`configs/smoke.toml`) or key=value pairs
    (`"num-server-rounds=2 strategy.mode='fedprox'"`, values read as TOML, else as plain strings)."""
    out: dict[str, Any] = {}
    for value in values:
        text = value.strip()
        if text.endswith(".toml") or (Path(text).is_file() and "=" not in text):
            if not Path(text).expanduser().is_file():
                raise FileNotFoundError(f"-c {value}: no such config file")
            out.update(load_toml(Path(text).expanduser()))
            continue
        pairs = [f"{key}={raw}" for key, raw in _PAIR.findall(text)]
        leftover = _PAIR.sub("", text).strip()
        if not pairs or leftover:
            raise ConfigError(f"-c {value!r}: expected a TOML file or key=value pairs (e.g. num-server-rounds=2)")
        out.update(parse_overrides(pairs))
    return out


def app_defaults(app: str | Path) -> dict[str, Any]:
    """The run config a Flower app declares ([tool.flwr.app.config] of its pyproject.toml, flattened), which
    `flwr run` fuses with the overrides; {} when `app` is not a directory with a pyproject.toml."""
    pyproject = Path(app).expanduser() / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    with pyproject.open("rb") as handle:
        data = tomllib.load(handle)
    return flatten(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def check_run_dir(cfg: ExperimentConfig, run_dir: Path) -> checkpoint.ServerCheckpoint | None:
    """A new run refuses a directory that holds a run's metrics; a resumed one needs a usable checkpoint made with
    a compatible config, which it returns."""
    if not cfg.resume:
        refuse_existing_run(run_dir)
        return None
    saved = checkpoint.load(run_dir)  # falls back to the previous checkpoint when the latest is corrupt
    if saved is None:
        raise FileNotFoundError(f"resume = true but {run_dir} has no checkpoint to continue from")
    checkpoint.check_compatible(saved, cfg)
    return saved


def already_finished(cfg: ExperimentConfig, run_dir: Path, saved: checkpoint.ServerCheckpoint | None) -> str | None:
    """Why a resumed run has nothing to do (its status is `completed` and its checkpoint reached num-server-rounds),
    else None. Such a resume starts nothing and leaves every file as it is."""
    if saved is None or saved.round < cfg.num_server_rounds or read_status(run_dir).get("status") != "completed":
        return None
    return (f"{run_dir} already completed (round {saved.round} of num-server-rounds = {cfg.num_server_rounds}): "
            "resume = true has nothing to run and changed nothing; raise num-server-rounds to train it further")


def check_rewards(cfg: ExperimentConfig) -> None:
    """Import every tasks.rewards and tasks.trl-rewards function in the scoring worker, under its time limit
    (ConfigError naming the key and what was wrong), and warn about a task named there that none of the run's mixes
    lists (it may still be a task of a node's data file)."""
    from ..tasks.isolation import check_rewards as import_rewards
    from ..tasks.rewards import REWARDS_KEY, TRL_REWARDS_KEY, RewardError, parse_rewards, parse_trl_rewards
    from ..tasks.specs import mix_task_names

    table, trl = parse_rewards(cfg.tasks.rewards), parse_trl_rewards(cfg.tasks.trl_rewards)
    try:
        import_rewards(table)
        import_rewards(trl, TRL_REWARDS_KEY)
    except RewardError as err:
        raise ConfigError(str(err)) from None
    listed = set(mix_task_names(",".join([cfg.tasks.mix, cfg.tasks.node_mixes.replace(";", ","),
                                          cfg.pubswap.public_mix])))
    for key, tasks in ((REWARDS_KEY, [task for task, _ref in table.per_task]),
                       (TRL_REWARDS_KEY, [task for task, _reward in trl.per_task])):
        for task in tasks:
            if task not in listed:
                log.warning("%s names task %r, which no task mix of the run lists; it applies only to items of that "
                            "task (a node's data file)", key, task)


def robust_minimum_problem(cfg: ExperimentConfig, nodes: int) -> str | None:
    """Why a run of `nodes` simulated nodes could not train under `cfg`'s aggregation, or None: a robust rule keeps
    the global adapter in any round of fewer than MIN_ROBUST_REPLIES replies (#54 class 4), so with fewer nodes than
    that every round would be kept unless the run applies such rounds (strategy.apply-below-robust)."""
    from ..algorithms.lora_averaging import MIN_ROBUST_REPLIES, ROBUST
    from ..protocols.catalog import CATALOG

    strategy = cfg.strategy
    if nodes >= MIN_ROBUST_REPLIES or strategy.aggregation not in ROBUST or strategy.apply_below_robust \
            or not CATALOG[strategy.mode].averages_adapters:
        return None
    return (f"--nodes {nodes}: strategy.aggregation = {strategy.aggregation!r} needs at least {MIN_ROBUST_REPLIES} "
            "replies a round and keeps the global adapter otherwise, so no round would train; set "
            "strategy.aggregation = 'mean' (2 replies cannot outvote a bad one) or strategy.apply-below-robust = true")


def check(flat: Mapping[str, Any], run_id: int | str | None = None, *, run_dir: bool = True) -> Checked:
    """The config built from Flower's flat run config, and its run directory checked. Without a `run_id` (before
    Flower assigned one) the directory is only checked when `run-name` names it; `run_dir=False` checks the config
    alone (a remote SuperLink's run directory is on its machine)."""
    cfg = ExperimentConfig.from_flat(flat)
    trackers.check(cfg.output.report_to)  # the server's tracker package is installed (nodes never track)
    check_rewards(cfg)
    if not run_dir or (run_id is None and not cfg.run_name):
        return Checked(cfg, None)
    path = cfg.run_dir(run_id if run_id is not None else "")
    saved = check_run_dir(cfg, path)
    return Checked(cfg, path, saved, already_finished(cfg, path, saved))
