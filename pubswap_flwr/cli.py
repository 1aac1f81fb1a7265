"""The `pubswap` command.

    pubswap keys                              every run-config key with its default, allowed values and meaning
    pubswap run [-c CONFIG] [--nodes 4]       `flwr run . --stream` plus a status check (`flwr run` exits 0 on failure)
    pubswap simulate [-c CONFIG] --nodes N    one run in-process through Flower's simulation engine
    pubswap compare SWEEP.toml                arms x seeds, then report.md and plots
    pubswap report RUN_DIR...                 the report again, from metrics.jsonl alone
    pubswap ask RUN "question"                a run's trained adapter answers one question, prompted as in training

`run` and `simulate` take the same `-c` values, applied in order: TOML files and key=value pairs. Both check the
config and the run directory before starting Flower or Ray; a problem is one line on stderr and exit code 2. `run`
uses a local SuperLink of this checkout's own (`pubswap superlink status|stop`; superlink.py), the machine-wide one
with --shared-superlink, and warns when the SuperLink that will run the app was started from another checkout or
environment; it refuses a second run while one from this checkout is in flight (--another starts one beside it).
`simulate` runs the app in its own process and needs no SuperLink.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterator

from . import logs, superlink
from .config import describe, key_choices
from .follow import LogStream, finished_row, follow, status_file_ended
from .places import resolve_output
from .server import preflight
from .server.metrics import final_adapters, mark_failed, mark_stopped

FLWR_ENV = {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
FLOWER_STOPPED = "finished:stopped"  # `flwr ls` status of a run that `flwr stop` ended
FLOWER_FAILED = "finished:failed"  # a run Flower ended as failed (its ServerApp raised, or it lost its nodes)
INTERRUPTED = 130  # the exit code of a command ended by Ctrl-C (128 + SIGINT)
STOP_WAIT = 15.0  # seconds `pubswap superlink stop` waits for the SuperLink to end


class FlowerRunError(RuntimeError):
    """`flwr run` could not submit the run, or the run finished in a failed state."""


class UsageError(ValueError):
    """The command's config or run directory cannot be used; caught in main: one line on stderr, exit code 2."""


log = logging.getLogger(__name__)
BIN_DIR = Path(sys.executable).parent  # the venv's bin: flwr, flower-superlink, flower-supernode live here


def _flwr(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([flwr_executable(), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def flwr_executable(name: str = "flwr") -> str:
    local = BIN_DIR / name
    return str(local) if local.is_file() else name


def flower_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Flower commands: runtime dependency installation off, this venv's bin first on PATH
    (the CLI starts `flower-superlink` by name)."""
    path = f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **FLWR_ENV, "PATH": path, **(extra or {})}


def submit(app: str | Path, overrides: list[str], federation_config: str, env: dict[str, str],
           connection: str | None = None) -> str:
    """Start a run; returns its run id. Raises FlowerRunError with Flower's message on refusal."""
    args = ["run", str(app)] + ([connection] if connection else []) + ["--format", "json"]
    if federation_config:
        args += ["--federation-config", federation_config]
    for override in overrides:
        args += ["-c", override]
    done = _flwr(args, env)
    try:
        reply = json.loads(done.stdout[done.stdout.index("{"):])
    except (ValueError, json.JSONDecodeError) as err:
        raise FlowerRunError(f"flwr run gave no JSON answer (exit {done.returncode}): {done.stdout[-500:]} "
                             f"{done.stderr[-500:]}") from err
    if not reply.get("success"):
        raise FlowerRunError(f"flwr run refused the run: {reply.get('error-message', reply)}")
    return str(reply["run-id"])


def wait(run_id: str, env: dict[str, str], connection: str | None = None, poll: float | None = None,
         timeout: float | None = None, ended: Callable[[], bool] = lambda: False) -> dict:
    """Ask `flwr ls --run-id` until the run finishes; returns its row (status, status-details, elapsed...). Asked on
    follow.py's back-off (every `poll` seconds when given), and at once when `ended` (cheap) says the run ended."""
    def ask() -> dict | None:
        args = ["ls"] + ([connection] if connection else []) + ["--run-id", run_id, "--format", "json"]
        return finished_row(_flwr(args, env).stdout)

    try:
        return follow(ask, ended=ended, gaps=None if poll is None else itertools.repeat(poll), timeout=timeout)
    except TimeoutError as err:
        raise FlowerRunError(f"run {run_id} {err}") from err


def stream_logs(run_id: str, env: dict[str, str], connection: str | None = None) -> LogStream:
    """`flwr log RUN --stream` onto stdout, without the noise lines of every run (follow.NOISE)."""
    return LogStream([flwr_executable(), "log", run_id] + ([connection] if connection else []) + ["--stream"], env,
                     sys.stdout)


def run_statuses(link: superlink.Link) -> dict[str, str] | None:
    """{run id: status} of every run on the local SuperLink `link`; {} when it no longer runs there (its runs ended
    with it; asking `flwr ls` would start a new one), None when `flwr ls` gave no answer."""
    if not superlink.serves(link):
        return {}
    done = _flwr(["ls", "--format", "json"], flower_env(link.env()))
    try:
        rows = json.loads(done.stdout[done.stdout.index("{"):])["runs"]
        return {str(row["run-id"]): str(row["status"]) for row in rows}
    except (ValueError, KeyError, TypeError) as err:
        log.warning("flwr ls on 127.0.0.1:%d gave no run list (%s): %s", link.port, err,
                    (done.stdout + done.stderr)[-300:])
        return None


def follow_commands(run_id: str, link: superlink.Link | None, connection: str | None) -> tuple[str, str]:
    """The exact shell commands that follow and stop a run (the SuperLink's variables first for a local one)."""
    prefix = f"{link.prefix()} " if link is not None else ""
    tail = f" {connection}" if connection else ""
    flwr = flwr_executable()
    return f"{prefix}{flwr} log {run_id}{tail} --stream", f"{prefix}{flwr} stop {run_id}{tail}"


def is_flower_app(folder: str | Path) -> bool:
    """Whether `folder` has a pyproject.toml with a [tool.flwr.app] table (what `flwr run` needs)."""
    try:
        with (Path(folder).expanduser() / "pyproject.toml").open("rb") as handle:
            return isinstance(tomllib.load(handle).get("tool", {}).get("flwr", {}).get("app"), dict)
    except (OSError, tomllib.TOMLDecodeError):
        return False


def app_problem(app: str | Path) -> str | None:
    """Why `app` cannot be run as a Flower app, naming the checkout to run from instead; None when it can."""
    if is_flower_app(app):
        return None
    installed_from = Path(__file__).resolve().parents[1]  # the checkout, for an editable install
    checkout = installed_from if is_flower_app(installed_from) else "/path/to/pubswap-flwr"
    return (f"{Path(app).expanduser().resolve()} is not a Flower app (no pyproject.toml with [tool.flwr.app]): run "
            f"`pubswap run` from the pubswap-flwr checkout, or pass its folder: `pubswap run {checkout}`")


def cmd_keys(_: argparse.Namespace) -> int:
    choices = key_choices()
    for key, default, doc in describe():
        allowed = f"(one of: {' | '.join(choices[key])}) " if key in choices else ""
        print(f"{key:34} {json.dumps(default):>14}  {allowed}{doc}".rstrip())
    return 0


# -- run and simulate: the same -c values, checked before Flower or Ray start -----------------------------------


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", action="append", default=[], metavar="FILE.toml | KEY=VALUE ...",
                        help="a TOML file or key=value pairs (values as TOML, e.g. \"strategy.mode='fedprox' "
                             "train.local-steps=2\"); repeatable, applied in order")


def checked(flat: dict[str, Any], *, run_dir: bool = True) -> preflight.Checked:
    """The config and (with `run_dir`) its run directory, checked before anything starts, and a named run's
    directory claimed (preflight.claim_run_dir: the run gets the token as run-claim); a problem becomes a
    UsageError."""
    try:
        return preflight.check(flat, run_dir=run_dir, claim=run_dir)
    except preflight.PROBLEMS as err:
        raise UsageError(preflight.one_line(err)) from err


def read_config_options(args: argparse.Namespace) -> dict[str, Any]:
    try:
        return preflight.read_overrides(args.config)
    except preflight.PROBLEMS as err:
        raise UsageError(preflight.one_line(err)) from err


def toml_value(value: Any) -> str:
    """A run-config value (bool, int, float, str) as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML one
    raise UsageError(f"run-config value {value!r} is not a bool, number or string")


def write_overrides(overrides: dict[str, Any], path: Path) -> Path:
    """Overrides as a TOML file of dotted keys: `flwr run` takes one TOML file or key=value pairs, and a file
    carries any string (Flower's key=value pattern cannot quote a quote)."""
    path.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in overrides.items()), encoding="utf-8")
    return path


def local_link(args: argparse.Namespace) -> superlink.Link | None:
    """The local SuperLink this run goes to, or None for a remote connection. A named local connection other than
    `local` lives in the user's FLWR_HOME, so it keeps the user's SuperLink."""
    if not superlink.is_local_connection(args.connection, os.environ):
        return None
    shared = args.shared_superlink or args.connection not in (None, "local")
    return superlink.link_for(args.app, os.environ, shared=shared)


def refuse_second_run(record_home: Path) -> None:
    """A UsageError naming a run submitted from this checkout that is still pending or running, if there is one;
    the record keeps only those (and the ones that could not be asked about)."""
    running, keep = superlink.in_flight(superlink.read_submitted(record_home), run_statuses)
    superlink.write_submitted(record_home, keep)
    if not running:
        return
    run, status = running[-1]
    follow_it, stop_it = follow_commands(run.run_id, run.link, None)
    more = f" (and {len(running) - 1} more)" if len(running) > 1 else ""
    raise UsageError(f"run {run.run_id}{more} from this checkout is still {status} on 127.0.0.1:{run.link.port}: "
                     f"follow it with `{follow_it}`, stop it with `{stop_it}`, or pass --another to start one "
                     "beside it")


def forget_run(record_home: Path, run_id: str) -> None:
    with superlink.locked(record_home):
        runs = superlink.read_submitted(record_home)
        superlink.write_submitted(record_home, [run for run in runs if run.run_id != run_id])


def cmd_run(args: argparse.Namespace) -> int:
    if problem := app_problem(args.app):
        raise UsageError(problem)
    overrides = read_config_options(args)
    # A remote SuperLink's run directory is on its machine: only the config can be checked here.
    found = checked({**preflight.app_defaults(args.app), **overrides}, run_dir=not args.connection)
    if found.finished:
        print(found.finished)
        return 0
    if found.claim:  # the ServerApp, in the SuperLink's process, recognises its claim by this token
        overrides[preflight.CLAIM_KEY] = found.claim
    submitted: list[str] = []  # the run id, once Flower took the run
    try:
        return _submit_and_follow(args, found, overrides, submitted)
    except (UsageError, FlowerRunError):
        if found.run_dir is not None and not submitted:  # refused before any run held the name: free it again
            preflight.release_claim(found.run_dir, found.claim)
        raise


def _submit_and_follow(args: argparse.Namespace, found: preflight.Checked, overrides: dict[str, Any],
                       submitted: list[str]) -> int:
    cfg = found.config
    if not args.connection and (problem := preflight.robust_minimum_problem(cfg, args.nodes)):
        raise UsageError(problem)
    if not args.connection:
        # The local SuperLink resolves a relative output.dir against the directory it was started from, which may
        # be another checkout's; make it this directory's, where the run-name check above looked.
        overrides["output.dir"] = str(cfg.run_dir("-").parent)
    link = local_link(args)
    env = flower_env(link.env() if link is not None else None)
    if link is not None:
        print(f"SuperLink: {superlink.describe(link)}"
              + ("; `pubswap superlink stop` stops it, --shared-superlink uses the machine-wide one"
                 if link.kind == "own" else ""), flush=True)
        # a SuperLink runs the app in its own environment
        warning = superlink.mismatch_warning(env, advice="Stop it with `pubswap superlink stop` when no run of it "
                                                         "is in flight.") if link.kind == "own" else \
            superlink.mismatch_warning(env)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    federation = "" if args.connection else \
        f"num-supernodes={args.nodes} client-resources-num-cpus={args.cpus_per_client}" + \
        (f" client-resources-num-gpus={args.gpus_per_client}" if args.gpus_per_client > 0 else "")
    record_home = superlink.own_home(args.app, os.environ)
    with superlink.locked(record_home) if link is not None else contextlib.nullcontext(), \
            tempfile.TemporaryDirectory(prefix="pubswap-run-") as tmp:
        if link is not None and not args.another:
            refuse_second_run(record_home)
        config_files = [str(write_overrides(overrides, Path(tmp) / "overrides.toml"))] if overrides else []
        try:
            run_id = submit(args.app, config_files, federation, env, args.connection)
            submitted.append(run_id)
        except KeyboardInterrupt:
            list_it, stop_it = follow_commands("RUN_ID", link, args.connection)
            list_it = list_it.replace(" log RUN_ID", " ls").replace(" --stream", "")
            print(f"interrupted while submitting; if the run was submitted, `{list_it}` lists it and `{stop_it}` "
                  "stops it", file=sys.stderr)
            return INTERRUPTED
        if link is not None:
            superlink.write_submitted(record_home, superlink.read_submitted(record_home)
                                      + [superlink.Submitted(run_id, link)])
    follow_it, stop_it = follow_commands(run_id, link, args.connection)
    print(f"run {run_id} submitted (stop it with `{stop_it}`)", flush=True)
    log_stream = stream_logs(run_id, env, args.connection) if not args.quiet else None
    status_ended = status_file_ended(cfg.run_dir(run_id)) if not args.connection else (lambda: False)
    try:
        row = wait(run_id, env, args.connection,
                   ended=lambda: status_ended() or (log_stream is not None and log_stream.ended()))
    except KeyboardInterrupt:
        print(f"run {run_id} goes on on the SuperLink: follow it with `{follow_it}`, stop it with `{stop_it}`",
              file=sys.stderr)
        return INTERRUPTED
    finally:
        if log_stream is not None:
            log_stream.close()
    if link is not None:
        forget_run(record_home, run_id)
    status = row.get("status")
    if not args.connection:
        record_flower_outcome(cfg.run_dir(run_id), run_id, row)
        preflight.release_claim(cfg.run_dir(run_id), found.claim)  # the run ended (its ServerApp may have been killed)
    print(f"run {run_id}: {status} ({row.get('elapsed', 0):.0f} s) {row.get('status-details', '')}")
    if status == "finished:completed" and not args.connection:
        run_dir = cfg.run_dir(run_id)
        print(final_adapters(run_dir, (run_dir / "adapters" / "final").is_dir()))
    return 0 if status == "finished:completed" else 1


def record_flower_outcome(run_dir: Path, run_id: str, row: dict) -> None:
    """A run Flower ended as stopped or failed whose own process could not record it (killed, or told to exit
    without the reason): its status.json says so now."""
    status = row.get("status")
    if status == FLOWER_STOPPED:
        changed = mark_stopped(run_dir, "`flwr stop` (recorded by pubswap run: the run's process ended without "
                                        "recording it)")
    elif status == FLOWER_FAILED:
        changed = mark_failed(run_dir, f"Flower ended the run as failed: {row.get('status-details') or 'no details'}"
                                       " (recorded by pubswap run)")
    else:
        return
    if changed:
        print(f"run {run_id}: {run_dir / 'status.json'} now says {status.split(':', 1)[1]}")


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        config: dict[str, Any] = json.loads(args.json) if args.json else {}
    except json.JSONDecodeError as err:
        raise UsageError(f"--json: not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise UsageError(f"--json must hold a JSON object of run-config keys, got {type(config).__name__}")
    config.update(read_config_options(args))
    if args.run_name:
        config["run-name"] = args.run_name
    if args.out:
        config["output.dir"] = str(resolve_output(args.out))  # relative: outside the checkout, like output.dir
    found = checked(config)
    if found.finished:
        print(found.finished)
        return 0
    try:
        return _simulate_claimed(args, config, found)
    finally:
        if found.run_dir is not None:
            preflight.release_claim(found.run_dir, found.claim)


def _simulate_claimed(args: argparse.Namespace, config: dict[str, Any], found: preflight.Checked) -> int:
    from .interruption import clear_interrupt, interrupted
    from .server.metrics import read_status

    if found.claim:
        config[preflight.CLAIM_KEY] = found.claim
    if problem := preflight.robust_minimum_problem(found.config, args.nodes):
        raise UsageError(problem)
    run_dir = found.run_dir  # None without a run-name: the directory is named after Flower's run id
    address = args.ray_address or (os.environ.get("RAY_ADDRESS") if args.engine == "ray" else None) or None
    if address is not None:
        from .simulation import reachable_ray_address

        if args.engine == "inprocess":
            raise UsageError("--ray-address joins a Ray cluster; --engine inprocess runs without Ray")
        try:
            reachable_ray_address(address)
        except ValueError as err:
            raise UsageError(f"--ray-address: {err}" if args.ray_address else f"RAY_ADDRESS: {err}") from err
    logs.setup(verbose=args.verbose, flower=True)
    from .simulation import simulate, simulate_in_process

    clear_interrupt()
    started = time.time()
    try:
        with ctrl_c_reaches_the_run():
            if args.engine == "inprocess":
                simulate_in_process(config, args.nodes)
            else:
                simulate(config, args.nodes, cpus_per_client=args.cpus_per_client,
                         gpus_per_client=args.gpus_per_client, ray_address=address)
    except KeyboardInterrupt:
        return stopped_by_ctrl_c(run_dir, started)
    if interrupted():  # the KeyboardInterrupt was dropped on its way; the run saw the flag and stopped
        return stopped_by_ctrl_c(run_dir, started)
    if run_dir is not None and (status := read_status(run_dir)).get("status") != "completed":
        print(f"run did not complete: {status}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def ctrl_c_reaches_the_run() -> Iterator[None]:
    """While a run goes on in this process, Ctrl-C also tells the run to stop (`interrupt()`) before it raises
    KeyboardInterrupt. Python raises it wherever the main thread is; when that is a weakref callback or a `__del__`
    (logging's handler clean-up), it prints "Exception ignored" and drops it, and the command ran on (seen in CI). The
    flag carries it instead: the run stops at its next check, and such a dropped KeyboardInterrupt prints nothing."""
    from .interruption import interrupt, interrupted

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        interrupt()
        raise KeyboardInterrupt

    def on_unraisable(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and interrupted()):
            previous_hook(unraisable)

    previous_hook = sys.unraisablehook
    previous_handler = signal.signal(signal.SIGINT, on_ctrl_c)
    sys.unraisablehook = on_unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_handler)
        sys.unraisablehook = previous_hook


LINGER_S = 2.0  # how long threads the run left (Flower's engine's) may take to end after a Ctrl-C


def stopped_by_ctrl_c(run_dir: Path | None, started: float) -> int:
    """Ctrl-C on `pubswap simulate`: the run records `stopped` (its own thread, or here when it did not get to it),
    one line on stderr says where the partial run is, and the command ends with exit code 130, no traceback. A thread
    left running (a ServerApp busy in a model call) would hold the process open, so then the process exits at once,
    its output flushed. A second Ctrl-C meanwhile only makes it leave sooner."""
    from .interruption import INTERRUPTED_DETAIL
    from .server.metrics import read_status, stop_recording

    def lingering() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()
                and not t.daemon]

    recorded: list[Path] = []
    try:
        recorded = stop_recording(INTERRUPTED_DETAIL, since=started)  # the runs of this command
        deadline = time.monotonic() + LINGER_S
        for thread in lingering():
            thread.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    left_behind = lingering()
    if left_behind:  # whatever they log next is not the run's: the line below is the last
        for name in (logs.PACKAGE, "flwr"):
            logging.getLogger(name).disabled = True
    where = recorded[-1] if recorded else run_dir
    status = read_status(where).get("status") if where is not None else None
    print(f"interrupted (Ctrl-C): the partial run is in {where} (status.json says {status})" if status else
          "interrupted (Ctrl-C) before the run started: it wrote nothing", file=sys.stderr, flush=True)
    if left_behind:
        sys.stdout.flush()
        os._exit(INTERRUPTED)
    return INTERRUPTED


def register_run(sub) -> None:
    run = sub.add_parser("run", help="flwr run with a status check (non-zero exit when the run fails)")
    run.add_argument("app", nargs="?", default=".")
    run.add_argument("connection", nargs="?", default=None, help="SuperLink connection (default: local simulation)")
    add_config_options(run)
    run.add_argument("--nodes", type=int, default=4, help="simulated SuperNodes (default 4)")
    run.add_argument("--cpus-per-client", type=int, default=1)
    run.add_argument("--gpus-per-client", type=float, default=0.0,
                     help="GPU share per simulated client, e.g. 0.25 (default 0: CPU only)")
    run.add_argument("--quiet", action="store_true", help="do not stream the run's log")
    run.add_argument("--shared-superlink", action="store_true",
                     help="use the machine-wide local SuperLink (~/.flwr, 127.0.0.1:39091) instead of this checkout's "
                          "own (docs/running.md)")
    run.add_argument("--another", action="store_true",
                     help="submit even while a run from this checkout is still in flight")
    run.set_defaults(func=cmd_run)


def cmd_superlink(args: argparse.Namespace) -> int:
    if problem := app_problem(args.app):
        raise UsageError(problem)
    link = superlink.own_link(args.app, os.environ)
    pid = superlink.serving_pid(link)
    record_home = link.home
    with superlink.locked(record_home):
        running, keep = superlink.in_flight(superlink.read_submitted(record_home), run_statuses)
        superlink.write_submitted(record_home, keep)
    ours = [(run, status) for run, status in running if run.link == link]
    if pid is None and args.action == "stop" and superlink.serves(link):
        raise UsageError(f"without /proc the process on 127.0.0.1:{link.port} cannot be checked; if it is this "
                         f"checkout's SuperLink, stop it with `kill $(lsof -t -iTCP:{link.port} -sTCP:LISTEN)`")
    if args.action == "status" or pid is None:
        print(superlink.describe(link))
        for run, status in running:
            print(f"  run {run.run_id}: {status} on {run.link.name} (127.0.0.1:{run.link.port})")
        return 0
    if ours and not args.force:
        ids = ", ".join(run.run_id for run, _ in ours)
        raise UsageError(f"run {ids} {'is' if len(ours) == 1 else 'are'} still running on it; "
                         "`pubswap superlink stop --force` stops it with the SuperLink")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    while superlink.serving_pid(link) == pid:
        if time.monotonic() > deadline:
            raise FlowerRunError(f"{link.name} (pid {pid}) did not end within {STOP_WAIT:.0f} s of SIGTERM")
        time.sleep(0.2)
    print(f"stopped {link.name} (pid {pid}, 127.0.0.1:{link.port})")
    return 0


def register_superlink(sub) -> None:
    parser = sub.add_parser("superlink", help="this checkout's own local SuperLink: status, stop")
    parser.add_argument("action", choices=["status", "stop"])
    parser.add_argument("app", nargs="?", default=".", help="the checkout (default: this folder)")
    parser.add_argument("--force", action="store_true", help="stop it even while runs from this checkout are in "
                                                             "flight (they end with it)")
    parser.set_defaults(func=cmd_superlink)


def register_simulate(sub) -> None:
    simulate = sub.add_parser("simulate", help="one in-process run through Flower's simulation engine")
    add_config_options(simulate)
    simulate.add_argument("--json", help="flat config as JSON (applied first)")
    simulate.add_argument("--nodes", type=int, default=4)
    simulate.add_argument("--engine", choices=["ray", "inprocess"], default="ray",
                          help="ray: Flower's simulation engine (clients in parallel); inprocess: no Ray, nodes served "
                               "one after another in this process (same code and results, quick to start; each "
                               "node's message gets the whole strategy.timeout from its turn)")
    simulate.add_argument("--cpus-per-client", type=int, default=1)
    simulate.add_argument("--gpus-per-client", type=float, default=0.0,
                          help="GPU share per client, e.g. 0.25 (default 0: CPU only)")
    simulate.add_argument("--ray-address", metavar="HOST:PORT",
                          help="run on a running Ray cluster: its head node's address (`ray start --head --port`), "
                               "or auto (default: $RAY_ADDRESS when set, else a Ray instance of this run's own)")
    simulate.add_argument("--run-name")
    simulate.add_argument("--out", help="output.dir (a relative one resolves like output.dir: outside the checkout "
                                        "when run from it, docs/running.md)")
    simulate.add_argument("--verbose", action="store_true",
                          help="also a line per client reply in every exchange (time, reward, bytes)")
    simulate.set_defaults(func=cmd_simulate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pubswap", description="pubswap-flwr: federated and swarm RL post-training")
    sub = parser.add_subparsers(dest="command", required=True)
    keys = sub.add_parser("keys", help="list every run-config key with its default and allowed values")
    keys.set_defaults(func=cmd_keys)
    register_run(sub)
    register_superlink(sub)
    register_simulate(sub)
    from .compare import register as register_compare
    from .deployment import register as register_deploy

    register_compare(sub)
    register_deploy(sub)
    from .export import register as register_export  # `pubswap export RUN OUT [--merged]`
    from .results.verify import register as register_verify  # `pubswap verify RUN`

    register_export(sub)
    register_verify(sub)
    from .results.ask import register as register_ask  # `pubswap ask RUN "question"`

    register_ask(sub)
    args = parser.parse_args(argv)
    if args.command in ("compare", "report"):
        logs.setup()
    try:
        return args.func(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FlowerRunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
