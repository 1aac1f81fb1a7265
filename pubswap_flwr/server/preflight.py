"""Checks made before Flower or Ray start (`pubswap run | simulate`) and first thing in the ServerApp: the config
(every key and value) and the run directory (a new run must not reuse one; a resumed run needs its checkpoint).

Light on purpose: importing this module (and the CLI that calls it) loads neither Flower, Ray nor torch, so a bad
config fails in a moment with one line instead of after the simulation engine started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import socket
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..config import ConfigError, ExperimentConfig, flatten, load_toml, parse_overrides
from . import checkpoint, trackers
from .checkpoint import CheckpointError
from .metrics import RunExistsError, read_status, refuse_existing_run

log = logging.getLogger(__name__)

CLAIM_FILE = ".claim.json"  # in a named run's directory while a run holds it (claim_run_dir)
CLAIM_KEY = "run-claim"  # the run-config key that carries the claim's token to the run (ServerApp)


class RunClaimedError(RunExistsError):
    """Another run holds the claim on the run directory (the same run-name, at the same time)."""


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
    claim: str | None = None  # the token of this run's claim on `run_dir` (check(..., claim=True))


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


def _read_claim(path: Path) -> dict:
    """A claim file's fields ({} when it is gone or is not a claim: another program's file, or one cut short)."""
    from ..untrusted import UntrustedFileError, read_json

    try:
        held = read_json(path, limit=4096)
    except (OSError, UntrustedFileError):
        return {}
    return held if isinstance(held, dict) else {}


def _process_gone(held: dict) -> bool:
    """Whether the claim's process is known to have ended: it ran on this machine and no process has its id."""
    pid = held.get("pid")
    if held.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _claimed(run_dir: Path, held: dict) -> RunClaimedError:
    owner = (f"process {held.get('pid', '?')} on {held.get('host', '?')}, since {held.get('started', '?')}"
             if held else "its claim file cannot be read")
    hint = ""
    if not held or held.get("host") != socket.gethostname():  # this machine cannot tell whether it still runs
        hint = f"; if no run is using it, remove {run_dir / CLAIM_FILE}"
    return RunClaimedError(f"{run_dir} is claimed by another run ({owner}): choose another run-name, or wait for "
                           f"that run to end{hint}")


def claim_run_dir(run_dir: Path, token: str | None = None) -> str:
    """Claim `run_dir` for one run, before anything is prepared, and return the claim's token: of several runs given
    the same run-name at once exactly one gets it (the claim file appears whole, by a hard link that fails when it
    exists). With the `token` of the claim already there (the run itself, in another process: `pubswap run`'s
    ServerApp runs in the SuperLink's), that claim is recognised as its own and adopted: it names this process from
    then on (`pubswap run` may stop following while the run goes on). A claim whose process is gone, on this
    machine, is stale (a killed run, which `resume = true` continues): taken over with a warning. Any other claim is
    RunClaimedError naming the folder and the process that holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM_FILE
    mine = token or secrets.token_hex(16)
    record = {"token": mine, "pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    draft = run_dir / f".claim-{secrets.token_hex(8)}.tmp"
    draft.write_text(json.dumps(record), encoding="utf-8")
    try:
        for _attempt in range(3):
            try:
                os.link(draft, path)
                return mine
            except FileExistsError:
                held = _read_claim(path)
            if token is not None and held.get("token") == token:
                os.replace(draft, path)
                return token
            if not _process_gone(held):
                raise _claimed(run_dir, held)
            if _take_over(path, held):
                log.warning("took over the stale claim of %s (process %s on %s is gone)", run_dir, held.get("pid"),
                            held.get("host"))
        raise _claimed(run_dir, _read_claim(path))
    finally:
        draft.unlink(missing_ok=True)


def _take_over(path: Path, stale: dict) -> bool:
    """Move the stale claim aside (a rename: of several runs taking it over, one moves it); when what was moved is
    not that claim (another run took it over first and claimed anew), it goes back. Whether it was moved."""
    aside = path.with_name(f".claim-stale-{secrets.token_hex(8)}.json")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        if _read_claim(aside).get("token") != stale.get("token"):
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
            return False
        return True
    finally:
        aside.unlink(missing_ok=True)


def release_claim(run_dir: Path, token: str | None) -> None:
    """Remove the run's claim on `run_dir` when it is the one with `token` (another run's is left alone)."""
    path = run_dir / CLAIM_FILE
    if token and _read_claim(path).get("token") == token:
        path.unlink(missing_ok=True)


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


def check_model_packages(cfg: ExperimentConfig) -> None:
    """ConfigError naming the pip command when a packaged model the run names (model.name, model.node-models) needs
    a package that is not installed: found here in a moment, not when the model is prepared (half a minute in)."""
    from ..model_packages import PACKAGED, PackagedModelError, check_installed

    for name in cfg.model.named:
        if name in PACKAGED:
            try:
                check_installed(PACKAGED[name])
            except PackagedModelError as err:
                raise ConfigError(str(err)) from None


def robust_minimum_problem(cfg: ExperimentConfig, nodes: int) -> str | None:
    """Why a run of `nodes` simulated nodes could not train under `cfg`'s aggregation, or None: a robust rule keeps
    the global adapter in any round of fewer than MIN_ROBUST_REPLIES replies (#54 class 4), so with fewer nodes than
    that every round would be kept unless the run applies such rounds (strategy.apply-below-robust)."""
    from ..algorithms.lora_averaging import MIN_ROBUST_REPLIES, ROBUST
    from ..config.catalog import CATALOG

    strategy = cfg.strategy
    if nodes >= MIN_ROBUST_REPLIES or strategy.aggregation not in ROBUST or strategy.apply_below_robust \
            or not CATALOG[strategy.mode].averages_adapters:
        return None
    return (f"--nodes {nodes}: strategy.aggregation = {strategy.aggregation!r} needs at least {MIN_ROBUST_REPLIES} "
            "replies a round and keeps the global adapter otherwise, so no round would train; set "
            "strategy.aggregation = 'mean' (2 replies cannot outvote a bad one) or strategy.apply-below-robust = true")


def check(flat: Mapping[str, Any], run_id: int | str | None = None, *, run_dir: bool = True,
          claim: bool = False) -> Checked:
    """The config built from Flower's flat run config, and its run directory checked. Without a `run_id` (before
    Flower assigned one) the directory is only checked when `run-name` names it; `run_dir=False` checks the config
    alone (a remote SuperLink's run directory is on its machine, and so are the models: the packaged models' packages
    are checked only with `run_dir`)."""
    cfg = ExperimentConfig.from_flat(flat)
    trackers.check(cfg.output.report_to)  # the server's tracker package is installed (nodes never track)
    check_rewards(cfg)
    if run_dir:
        check_model_packages(cfg)
    if not run_dir or (run_id is None and not cfg.run_name):
        return Checked(cfg, None)
    path = cfg.run_dir(run_id if run_id is not None else "")
    saved = check_run_dir(cfg, path)
    finished = already_finished(cfg, path, saved)
    token = claim_run_dir(path) if claim and cfg.run_name and not finished else None
    return Checked(cfg, path, saved, finished, token)
