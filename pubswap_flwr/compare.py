"""Comparison runner: one sweep file names a base config, the arms and the seeds; every (arm, seed) run goes
through Flower's simulation engine in its own process, completed runs are skipped, failed ones are reported, and
the report (tables and plots) is written from the runs' metrics.jsonl. A completed run is skipped only when the config
it recorded is the one its arm gives now: a run made before its arm was edited is refused, naming the keys that
differ, until `--rerun-edited` moves it to results/<sweep>/replaced/ and runs the arm again.

    pubswap compare configs/compare-pubswap.toml [--out results] [--only ARM ...] [--dry-run] [--rerun-edited]
    pubswap simulate -c configs/smoke.toml --nodes 2 --run-name x --out runs     (one run, in-process)

Sweep file:

    name = "compare-pubswap"
    nodes = 4                        # simulated SuperNodes
    seeds = [0, 1, 2]
    base = "fedavg.toml"             # optional: a preset (relative to the sweep file) applied first
    ray-address = "10.0.0.5:6379"    # optional: run on this Ray cluster (else $RAY_ADDRESS, else this machine)
    [config]                         # overrides for every arm (nested tables or dotted keys)
    num-server-rounds = 8
    [arms.fedavg]
    strategy.mode = "fedavg"
    [arms.balanced]
    strategy.mode = "pubswap"
    pubswap.swap = "balanced"
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import msgspec
from msgspec import Meta, Struct

from .config import ConfigError, ExperimentConfig, flatten, load_toml
from .places import outside_checkout, resolve_output
from .schema import parse_value_of
from .server.metrics import CONFIG_FILE, KEEP_UNREADABLE, UNREADABLE, RunConfigFile, read_status
from .tasks.splits import MAX_NODES
from .untrusted import UntrustedFileError, is_present, one_line, read_json

log = logging.getLogger("pubswap_flwr.compare")


class SweepError(ValueError):
    """The sweep file is invalid."""


@dataclass
class Arm:
    name: str
    overrides: dict[str, Any]
    error: str | None = None  # set when the arm's config is invalid: it is reported, never run


@dataclass
class Sweep:
    name: str
    nodes: int
    seeds: list[int]
    base: dict[str, Any]
    arms: list[Arm]
    source: Path
    cpus_per_client: int = 1
    gpus_per_client: float = 0.0
    timeout_s: float = 4 * 3600
    notes: str = ""
    ray_address: str | None = None  # a running Ray cluster's head node (host:port); None: $RAY_ADDRESS or local
    engine: str = "ray"  # `pubswap simulate --engine`: ray (clients in parallel) or inprocess (no Ray, one by one)

    def run_name(self, arm: str, seed: int) -> str:
        return f"{arm}-s{seed}"

    def config_for(self, arm: Arm, seed: int, out: Path) -> dict[str, Any]:
        return {**self.base, **arm.overrides, "seed": seed, "run-name": self.run_name(arm.name, seed),
                "output.dir": str(out / "runs")}


class SweepFile(Struct, kw_only=True, rename="kebab"):
    """A sweep file (TOML) as `pubswap compare` reads it: `[arms.<name>]` tables of config keys over a `base` config
    file and a `[config]` table, the seeds and nodes every arm runs, and how Ray places the clients."""

    arms: Annotated[dict[str, dict[str, Any]], Meta(min_length=1)]
    name: str = ""
    nodes: Annotated[int, Meta(ge=1, le=MAX_NODES)] = 4
    seeds: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1)] = msgspec.field(default_factory=lambda: [0])
    base: str = ""  # a config file beside the sweep file
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    cpus_per_client: Annotated[int, Meta(ge=1)] = 1
    gpus_per_client: Annotated[float, Meta(ge=0)] = 0.0  # a fraction shares a GPU
    timeout_s: Annotated[float, Meta(gt=0)] = 4 * 3600
    notes: str = ""
    ray_address: str | None = None
    engine: Literal["ray", "inprocess"] = "ray"  # inprocess: no Ray, nodes served one after another (same metrics)


INPROCESS_NEEDS_NO_RAY = 'engine = "inprocess" runs without Ray: ray-address and gpus-per-client need engine = "ray"'
SWEEP_KEYS = sorted(SweepFile.__struct_encode_fields__)


def load_sweep(path: str | Path) -> Sweep:
    """Parse and check a sweep file; an arm with an unknown key or a bad value is kept with its error."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SweepError(f"{path}: cannot read the sweep file: {err}") from err
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise SweepError(f"{path}: unknown sweep keys {unknown}; known: {SWEEP_KEYS}")
    if not raw.get("arms"):
        raise SweepError(f"{path}: no [arms.<name>] tables")
    sweep = parse_value_of(path, raw, SweepFile, SweepError)
    base: dict[str, Any] = {}
    if sweep.base:
        base.update(load_toml(path.parent / sweep.base))
    base.update(flatten(sweep.config))
    try:
        ExperimentConfig.from_flat(base)
    except ConfigError as err:
        raise SweepError(f"{path}: the base config is invalid: {err}") from err
    arms = []
    for name, body in sweep.arms.items():
        arm = Arm(name, flatten(body))
        try:
            ExperimentConfig.from_flat({**base, **arm.overrides})
        except ConfigError as err:
            arm.error = f"arm {name!r}: {err}"
        arms.append(arm)
    address = sweep.ray_address
    if sweep.engine == "inprocess" and (address is not None or sweep.gpus_per_client > 0):
        raise SweepError(f"{path}: {INPROCESS_NEEDS_NO_RAY}")
    if address is not None:
        from .simulation import check_ray_address

        try:
            address = check_ray_address(address)
        except ValueError as err:
            raise SweepError(f"{path}: {err}") from err
    return Sweep(sweep.name or path.stem, sweep.nodes, list(sweep.seeds), base, arms, path, sweep.cpus_per_client,
                 float(sweep.gpus_per_client), float(sweep.timeout_s), sweep.notes, address, sweep.engine)


@dataclass
class RunOutcome:
    arm: str
    seed: int
    run_dir: Path
    status: str  # completed | failed | skipped-invalid
    detail: str = ""
    seconds: float = 0.0
    reused: bool = False


class OutcomeEntry(Struct):
    """One run's entry of a sweep's outcomes.json, as `pubswap compare` writes it and scripts/publish_results.py
    reads it (which also checks the arm and seed against the sweep file)."""

    arm: str
    seed: int
    status: str
    detail: str = ""
    seconds: float = 0.0
    reused: bool = False
    run_dir: str = ""

    @classmethod
    def of(cls, outcome: RunOutcome) -> "OutcomeEntry":
        return cls(outcome.arm, outcome.seed, outcome.status, outcome.detail, round(outcome.seconds, 1),
                   outcome.reused, str(outcome.run_dir))


# parameters: one run's command line (pubswap simulate's options), the optional ones with defaults
def run_one(config: dict[str, Any], nodes: int, cpus_per_client: int, timeout_s: float, log_path: Path,
            gpus_per_client: float = 0.0, ray_address: str | None = None, engine: str = "ray") -> tuple[int, str]:
    """One run in a fresh process through Flower's simulation engine, on this machine or on the Ray cluster at
    `ray_address` (the process also inherits $RAY_ADDRESS), or without Ray (`engine` inprocess); (exit code, last
    lines of its log)."""
    command = [sys.executable, "-m", "pubswap_flwr.cli", "simulate", "--nodes", str(nodes)]
    if engine == "inprocess":
        command += ["--engine", "inprocess"]
    else:
        command += ["--cpus-per-client", str(cpus_per_client), "--gpus-per-client", str(gpus_per_client)]
    command += ["--json", json.dumps(config)]
    if ray_address is not None:
        command += ["--ray-address", ray_address]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as handle:
        try:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False).returncode
        except subprocess.TimeoutExpired:
            code = 124
    tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
    return code, "\n".join(tail)


NOT_RUN = "not-run"  # a run --report-only found unmade: neither a failure nor a result, listed as pending
REPLACED_DIR = "replaced"  # beside runs/: where --rerun-edited moves a completed run its arm no longer gives
MAX_CONFIG_BYTES = 1 << 22  # a run's config.json is a few KB (tasks.custom's JSON its longest value)
MAX_DIFFERENCES_SHOWN = 12
# Keys a completed run may have recorded other values of and still be its arm's run: where the runner put it (the
# run-name is the folder's own name; output.dir moves with --out and $PUBSWAP_OUTPUT_ROOT), `resume` (a run continued
# from its checkpoint), and what a runner sets about where and how fast a run goes rather than what it computes
# (scripts/gpu_sweeps.py sets model.threads and model.device for every run; deploy.* acts on deployed nodes only,
# never in a sweep's simulation). Every other key, paths to data files included, counts.
RUNNER_KEYS = frozenset({"run-name", "run-claim", "output.dir", "resume", "model.threads", "model.device"})
RUNNER_SECTIONS = ("deploy.",)
EDITED_ADVICE = (f"to run the arm again: --rerun-edited (the old run is moved to {REPLACED_DIR}/ beside runs/, never "
                 "deleted)")


def config_differences(recorded: Mapping[str, Any], now: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """`key: recorded -> now` for every key of `now` (a whole flat config, ExperimentConfig.to_flat) whose value the
    run recorded differs, the runner's keys (RUNNER_KEYS) left out. A key the record lacks (a run made before the key
    existed) counts only when `now` sets it off its value in `defaults`; a recorded key the code no longer knows is
    not compared: no arm can set it now."""
    differences = []
    for key, value in now.items():
        if key in RUNNER_KEYS or key.startswith(RUNNER_SECTIONS):
            continue
        if key not in recorded:
            if not _same(value, defaults[key]):
                differences.append(f"{key}: (not recorded) -> {_shown(value)}")
        elif not _same(recorded[key], value):
            differences.append(f"{key}: {_shown(recorded[key])} -> {_shown(value)}")
    return differences


def _same(recorded: Any, now: Any) -> bool:
    return recorded == now and isinstance(recorded, bool) == isinstance(now, bool)  # True == 1 in Python


def _shown(value: Any, longest: int = 60) -> str:
    """A config value as Python writes it (control characters of a forged file escaped), cut to `longest`."""
    text = repr(value)
    return text if len(text) <= longest else text[:longest - 3] + "..."


def recorded_config(run_dir: Path) -> dict[str, Any]:
    """The flat config a run recorded (config.json as RunRecorder writes it), read as untrusted: UntrustedFileError
    naming the file when it is missing, a link, not JSON, of another shape or without config keys."""
    path = run_dir / CONFIG_FILE
    config = parse_value_of(path, read_json(path, limit=MAX_CONFIG_BYTES), RunConfigFile, UntrustedFileError).config
    if not config:
        raise UntrustedFileError(f"{path}: holds no run-config keys ('config')")
    return config


@dataclass(frozen=True)
class Reuse:
    """Whether a completed run can stand as its arm's run now: `problem` says why not ("" when it can); `edited`:
    the problem is its config (another than the arm's now, or unreadable), which --rerun-edited runs again."""

    problem: str = ""
    edited: bool = False

    @property
    def detail(self) -> str:
        """The refusal as a sweep reports it: the problem and what to do about it."""
        return f"{self.problem}; {EDITED_ADVICE if self.edited else KEEP_UNREADABLE}"


def check_reuse(run_dir: Path, config: Mapping[str, Any]) -> Reuse:
    """Whether the completed run in `run_dir` ran `config` (the flat config its arm would run now; a valid one) and
    left what a report reads (report.summarize_run: metrics.jsonl with rows, ...)."""
    from .report.summaries import summarize_run

    try:
        recorded = recorded_config(run_dir)
    except UntrustedFileError as err:
        return Reuse(f"{one_line(err)}; which config the run ran cannot be told", edited=True)
    differences = config_differences(recorded, ExperimentConfig.from_flat(config).to_flat(),
                                     ExperimentConfig().to_flat())
    if differences:
        more = len(differences) - MAX_DIFFERENCES_SHOWN
        listed = ", ".join(differences[:MAX_DIFFERENCES_SHOWN]) + (f" and {more} more" if more > 0 else "")
        return Reuse(f"{run_dir / CONFIG_FILE}: the run was made with another config than its arm gives now "
                     f"(recorded -> now: {listed})", edited=True)
    try:
        summarize_run(run_dir)
    except ValueError as err:  # UntrustedFileError, MetricsError: a file of the run the report cannot use
        return Reuse(one_line(err))
    return Reuse()


def move_aside(run_dir: Path, log_path: Path, into: Path) -> Path:
    """Move a completed run's folder into `into` under its name and the time (e.g. replaced/a-s0-20250102-030405),
    and its log beside it as <that name>.log; never over anything already there. Returns where the run went."""
    into.mkdir(parents=True, exist_ok=True)
    stem = f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    target, number = into / stem, 1
    while is_present(target) or is_present(into / f"{target.name}.log"):
        number += 1
        target = into / f"{stem}-{number}"
    run_dir.rename(target)
    if is_present(log_path):
        log_path.rename(into / f"{target.name}.log")
    return target


def is_failure(status: str) -> bool:
    """Whether an outcome's status is a failure for the report: neither completed nor merely not made yet."""
    return status not in ("completed", NOT_RUN)


def run_sweep(sweep: Sweep, out: Path, only: list[str] | None = None, dry_run: bool = False,
              report_only: bool = False, rerun_edited: bool = False) -> list[RunOutcome]:
    """Run the sweep's (arm, seed) runs that are not complete yet; `report_only` runs none and records each of them
    as NOT_RUN (a sweep stopped early: its completed runs can be reported and published, paired by seed). A
    completed run is reused only when check_reuse passes it, else it is a failure named with the reason and left as
    it is; with `rerun_edited`, one whose config is not its arm's now is moved aside (move_aside) and run again."""
    outcomes: list[RunOutcome] = []
    # A seed at a time (every arm of seed 0, then seed 1, ...): a sweep stopped early still holds paired arms.
    for seed in sweep.seeds:
        for arm in sweep.arms:
            if only and arm.name not in only:
                continue
            run_dir = out / "runs" / sweep.run_name(arm.name, seed)
            if arm.error:
                log.error("%s", arm.error)
                outcomes.append(RunOutcome(arm.name, seed, run_dir, "skipped-invalid", arm.error))
                continue
            log_path = out / "logs" / f"{sweep.run_name(arm.name, seed)}.log"
            status = read_status(run_dir)
            if status.get("status") == "completed":
                reuse = check_reuse(run_dir, sweep.config_for(arm, seed, out))
                if not reuse.problem:
                    log.info("%s seed %d: already complete, skipped", arm.name, seed)
                    outcomes.append(RunOutcome(arm.name, seed, run_dir, "completed", status["detail"],
                                               status["elapsed_s"] or 0.0, reused=True))
                    continue
                if not (reuse.edited and rerun_edited) or report_only:
                    log.error("%s seed %d: %s", arm.name, seed, reuse.detail)
                    outcomes.append(RunOutcome(arm.name, seed, run_dir, "failed", reuse.detail))
                    continue
                if dry_run:
                    log.info("%s seed %d: %s; would move it to %s/ and run %s", arm.name, seed, reuse.problem,
                             out / REPLACED_DIR, sweep.config_for(arm, seed, out))
                    continue
                moved = move_aside(run_dir, log_path, out / REPLACED_DIR)
                log.warning("%s seed %d: %s; moved to %s, running it again", arm.name, seed, reuse.problem, moved)
                status = {}
            if status.get("status") == UNREADABLE:  # never cleared unseen: it may be a finished run
                detail = f"{status['detail']}; {KEEP_UNREADABLE}"
                log.error("%s seed %d: %s", arm.name, seed, detail)
                outcomes.append(RunOutcome(arm.name, seed, run_dir, "failed", detail))
                continue
            if dry_run:
                log.info("%s seed %d: would run %s", arm.name, seed, sweep.config_for(arm, seed, out))
                continue
            if report_only:  # a run that ended badly stays a failure; one never started or cut off is pending
                ended = status.get("status") in ("failed", "stopped")
                outcomes.append(RunOutcome(arm.name, seed, run_dir, "failed" if ended else NOT_RUN,
                                           f"{status['status']}: {status.get('detail', '')}" if ended
                                           else "not run yet (--report-only)"))
                continue
            if run_dir.exists():  # an interrupted or failed attempt: start that run over
                _clear(run_dir)
            started = time.time()
            log.info("%s seed %d: running (%d nodes)", arm.name, seed, sweep.nodes)
            code, tail = run_one(sweep.config_for(arm, seed, out), sweep.nodes, sweep.cpus_per_client,
                                 sweep.timeout_s, log_path, sweep.gpus_per_client, sweep.ray_address, sweep.engine)
            status = read_status(run_dir)
            ok = code == 0 and status.get("status") == "completed"
            detail = status.get("detail") or tail
            outcome = RunOutcome(arm.name, seed, run_dir, "completed" if ok else "failed",
                                 detail if ok else f"exit {code}: {detail}", time.time() - started)
            (log.info if ok else log.error)("%s seed %d: %s in %.0f s%s", arm.name, seed, outcome.status,
                                            outcome.seconds, "" if ok else f" — {outcome.detail}")
            outcomes.append(outcome)
    return outcomes


def reportable_runs(sweep: Sweep, out: Path, outcomes: list[RunOutcome]) -> tuple[list[Path], list[RunOutcome]]:
    """The sweep's completed runs its report reads, arm by arm: those `outcomes` (this invocation's) completed, and
    for the (arm, seed) runs an --only invocation left alone, each completed one on disk that check_reuse passes.
    Also a failed outcome for each run left alone that cannot stand as its arm's now (skipped-invalid for an arm
    whose config is invalid), so that neither the report nor outcomes.json takes it for that arm's result."""
    done = {(o.arm, o.seed): o for o in outcomes}
    runs: list[Path] = []
    refused: list[RunOutcome] = []
    for arm in sweep.arms:
        for seed in sweep.seeds:
            run_dir = out / "runs" / sweep.run_name(arm.name, seed)
            if (arm.name, seed) in done:
                if done[arm.name, seed].status == "completed":
                    runs.append(run_dir)
                continue
            if read_status(run_dir).get("status") != "completed":
                continue
            if arm.error:
                refused.append(RunOutcome(arm.name, seed, run_dir, "skipped-invalid", arm.error))
                continue
            reuse = check_reuse(run_dir, sweep.config_for(arm, seed, out))
            if reuse.problem:
                log.error("%s seed %d: %s", arm.name, seed, reuse.detail)
                refused.append(RunOutcome(arm.name, seed, run_dir, "failed", reuse.detail))
            else:
                runs.append(run_dir)
    return runs, refused


def merged_outcomes(path: Path, sweep: Sweep, entries: list[dict]) -> list[dict]:
    """The sweep's outcomes.json after an invocation that produced `entries`: these, and the earlier file's entries
    for the (arm, seed) runs this invocation left alone (an `--only` run must not drop the other arms, which
    scripts/publish_results.py publishes from this file), in the sweep's order (seed by seed, arms as listed)."""
    previous: list[dict] = []
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            log.warning("%s is not JSON (%s): it is replaced by this invocation's outcomes only", path, err)
    by_run = {(o.get("arm"), o.get("seed")): o for o in previous if isinstance(o, dict)}
    by_run.update({(o["arm"], o["seed"]): o for o in entries})
    return [by_run[key] for key in ((arm.name, seed) for seed in sweep.seeds for arm in sweep.arms) if key in by_run]


def _clear(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(run_dir)


def cmd_compare(args: argparse.Namespace) -> int:
    from .report import write_report

    try:
        sweep = load_sweep(args.sweep)
        if args.ray_address is not None:
            from .simulation import check_ray_address

            if sweep.engine == "inprocess":
                raise SweepError('--ray-address runs the arms on a Ray cluster; the sweep file says engine = '
                                 '"inprocess"')
            sweep.ray_address = check_ray_address(args.ray_address)
    except ValueError as err:  # SweepError, or a bad --ray-address
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = resolve_output(args.out) / sweep.name
    out.mkdir(parents=True, exist_ok=True)
    outcomes = run_sweep(sweep, out, args.only, args.dry_run, args.report_only, args.rerun_edited)
    if args.dry_run:
        return 0
    # Every completed run of the sweep on disk that is its arm's (an --only invocation keeps the other arms).
    completed, refused = reportable_runs(sweep, out, outcomes)
    outcomes += refused
    entries = [msgspec.to_builtins(OutcomeEntry.of(o)) for o in outcomes]
    (out / "outcomes.json").write_text(json.dumps(merged_outcomes(out / "outcomes.json", sweep, entries), indent=2))
    failed = [o for o in outcomes if is_failure(o.status)]
    pending = [o for o in outcomes if o.status == NOT_RUN]
    try:
        report = write_report(out, completed, failures={(o.arm, o.seed): o.detail for o in failed},
                              pending=[(o.arm, o.seed) for o in pending],
                              title=sweep.name, notes=sweep.notes, command=" ".join(["pubswap"] + sys.argv[1:]),
                              force=True, arm_order=[arm.name for arm in sweep.arms])  # its own sweep's report
    except ValueError as err:  # a file of a run just made that the report cannot use (check_reuse read the others)
        print(f"pubswap compare: no report: {one_line(err)}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    if pending:
        print(f"{len(pending)} run(s) not made yet: " + ", ".join(sweep.run_name(o.arm, o.seed) for o in pending))
    for o in failed:
        print(f"FAILED {o.arm} seed {o.seed}: {o.detail}", file=sys.stderr)
    return 1 if failed else 0


def _report_command(args: argparse.Namespace, runs: list[Path]) -> str:
    """The `pubswap report` invocation as recorded in the report: `<dir>/*` when the runs are every run directory
    of one folder (what a shell glob expands to), else the run directories as given."""
    parents = {run.parent for run in runs}
    parent = next(iter(parents)) if len(parents) == 1 else None
    every = parent is not None and {p for p in parent.iterdir() if (p / "metrics.jsonl").is_file()} == set(runs)
    parts = ["pubswap", "report"] + ([f"{parent}/*"] if every else [str(run) for run in runs])
    if args.out:
        parts += ["--out", args.out]
    if args.baseline:
        parts += ["--baseline", args.baseline]
    if args.force:
        parts.append("--force")
    if args.exclude_self_reported:
        parts.append("--exclude-self-reported")
    return " ".join(parts)


def default_report_dir(first_run: Path) -> Path:
    """Where `pubswap report` writes without --out: a sweep's own folder (results/<sweep>/, beside its
    outcomes.json) for its runs, else a `report/` folder beside the runs (runs/report/: never the directory the
    command runs from); for runs inside the project's checkout (docs/results/...), the same path under the user
    data directory's reports/ instead, since the next `flwr run` bundles the checkout."""
    runs_dir = first_run.resolve().parent
    if (runs_dir.parent / "outcomes.json").is_file():
        return outside_checkout(runs_dir.parent)
    return outside_checkout(runs_dir / "report")


def cmd_report(args: argparse.Namespace) -> int:
    from .report import ReportExistsError, write_report

    runs = [Path(p) for p in args.runs]
    out = Path(args.out) if args.out else default_report_dir(runs[0])
    try:
        report = write_report(out, runs, title=args.title, notes=args.notes, baseline=args.baseline,
                              command=_report_command(args, runs), force=args.force,
                              exclude_self_reported=args.exclude_self_reported)
    except ReportExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # a run's file that cannot be used (UntrustedFileError, MetricsError), a --baseline
        print(f"pubswap report: {one_line(err)}", file=sys.stderr)  # arm with no runs
        return 2
    print(f"report: {report}")
    return 0


def register(sub) -> None:
    compare = sub.add_parser("compare", help="run a sweep of arms x seeds and write the report")
    compare.add_argument("sweep", help="sweep TOML file (see configs/compare-*.toml)")
    compare.add_argument("--out", default="results", help="results root (default: results/<sweep name>; a relative "
                                                          "path resolves as output.dir does, places.py)")
    compare.add_argument("--only", nargs="*", help="run only these arms")
    compare.add_argument("--dry-run", action="store_true", help="print what would run")
    compare.add_argument("--report-only", action="store_true",
                         help="run nothing: write outcomes.json and the report from the runs already complete, "
                              "listing the others as not run yet (a sweep stopped early, to publish what it has)")
    compare.add_argument("--rerun-edited", action="store_true",
                         help="run again a completed run whose recorded config is not its arm's now (the sweep file "
                              f"was edited since): the old run is moved to <out>/<sweep>/{REPLACED_DIR}/ first")
    compare.add_argument("--ray-address", metavar="HOST:PORT",
                         help="run every arm on this running Ray cluster (its head node's `ray start --head --port`; "
                              "overrides the sweep file's ray-address)")
    compare.set_defaults(func=cmd_compare)
    report = sub.add_parser("report", help="write report.md and plots from run directories' metrics.jsonl")
    report.add_argument("runs", nargs="+", help="run directories (named <arm>-s<seed>)")
    report.add_argument("--out", help="where report.md and plots/ go (default: a sweep's own folder for its runs, "
                                      "else report/ beside the first run)")
    report.add_argument("--title", help="report title (default: the previous report's, else "
                                        "'pubswap-flwr comparison')")
    report.add_argument("--notes", help="text under the title (default: the previous report's notes)")
    report.add_argument("--baseline", metavar="ARM",
                        help="arm the others are compared with, seed by seed (default: the first arm given)")
    report.add_argument("--force", action="store_true", help="replace an existing report.md")
    report.add_argument("--exclude-self-reported", action="store_true",
                        help="leave out the runs whose held-out results their nodes reported themselves (sapo, local: "
                             "the server checks which items they cover, not their answers)")
    report.set_defaults(func=cmd_report)
