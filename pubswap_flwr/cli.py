"""The `pubswap` command.

    pubswap keys                              every run-config key with its default and meaning
    pubswap run [-c OVERRIDES] [--nodes 4]    `flwr run . --stream` plus a status check (`flwr run` exits 0 on failure)
    pubswap simulate -c FILE --nodes N        one run in-process through Flower's simulation engine
    pubswap compare SWEEP.toml                arms x seeds, then report.md and plots
    pubswap report RUN_DIR...                 the report again, from metrics.jsonl alone
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from .config import describe

FLWR_ENV = {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
FINISHED = "finished:"


class FlowerRunError(RuntimeError):
    """`flwr run` could not submit the run, or the run finished in a failed state."""


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


def wait(run_id: str, env: dict[str, str], connection: str | None = None, poll: float = 2.0,
         timeout: float | None = None) -> dict:
    """Poll `flwr ls --run-id` until the run finishes; returns its row (status, status-details, elapsed...)."""
    deadline = None if timeout is None else time.time() + timeout
    while True:
        done = _flwr(["ls"] + ([connection] if connection else []) + ["--run-id", run_id, "--format", "json"], env)
        try:
            rows = json.loads(done.stdout[done.stdout.index("{"):]).get("runs", [])
        except (ValueError, json.JSONDecodeError):
            rows = []
        if rows and str(rows[0].get("status", "")).startswith(FINISHED):
            return rows[0]
        if deadline is not None and time.time() > deadline:
            raise FlowerRunError(f"run {run_id} did not finish within {timeout:.0f} s")
        time.sleep(poll)


def stream_logs(run_id: str, env: dict[str, str], connection: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([flwr_executable(), "log", run_id] + ([connection] if connection else []) + ["--stream"],
                            env=env)


def cmd_keys(_: argparse.Namespace) -> int:
    for key, default, doc in describe():
        print(f"{key:34} {json.dumps(default):>14}  {doc}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    env = flower_env()
    federation = "" if args.connection else \
        f"num-supernodes={args.nodes} client-resources-num-cpus={args.cpus_per_client}" + \
        (f" client-resources-num-gpus={args.gpus_per_client}" if args.gpus_per_client > 0 else "")
    run_id = submit(args.app, args.config or [], federation, env, args.connection)
    print(f"run {run_id} submitted", flush=True)
    logs = stream_logs(run_id, env, args.connection) if not args.quiet else None
    try:
        row = wait(run_id, env, args.connection)
    finally:
        if logs is not None:
            logs.terminate()
            logs.wait(timeout=10)
    status = row.get("status")
    print(f"run {run_id}: {status} ({row.get('elapsed', 0):.0f} s) {row.get('status-details', '')}")
    return 0 if status == "finished:completed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pubswap", description="pubswap-flwr: federated and swarm RL post-training")
    sub = parser.add_subparsers(dest="command", required=True)
    keys = sub.add_parser("keys", help="list every run-config key with its default")
    keys.set_defaults(func=cmd_keys)
    run = sub.add_parser("run", help="flwr run with a status check (non-zero exit when the run fails)")
    run.add_argument("app", nargs="?", default=".")
    run.add_argument("connection", nargs="?", default=None, help="SuperLink connection (default: local simulation)")
    run.add_argument("-c", "--config", action="append", help="run-config overrides, as for flwr run -c")
    run.add_argument("--nodes", type=int, default=4, help="simulated SuperNodes (default 4)")
    run.add_argument("--cpus-per-client", type=int, default=1)
    run.add_argument("--gpus-per-client", type=float, default=0.0,
                     help="GPU share per simulated client, e.g. 0.25 (default 0: CPU only)")
    run.add_argument("--quiet", action="store_true", help="do not stream the run's log")
    run.set_defaults(func=cmd_run)
    from .compare import register as register_compare
    from .deploy import register as register_deploy

    register_compare(sub)
    register_deploy(sub)
    args = parser.parse_args(argv)
    if args.command in ("compare", "report"):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        return args.func(args)
    except FlowerRunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
