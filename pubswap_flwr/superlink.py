"""Which local SuperLink a `flwr run` will reach, and whether it runs apps in another checkout or environment.

Flower 1.42's CLI reaches the local SuperLink by port (127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT, default 39091)
and starts one only when none answers there; a running one is shared by every checkout and terminal on the machine.
It runs a submitted app with its own environment: the Python and packages (and pubswap-flwr install, whose data/ the
app reads) of the venv it was started from, its working directory (relative paths in the run config resolve there)
and its environment variables. The process listening on the port is found through /proc (Linux, own processes only):
its command line names the `flower-superlink` it runs, and /proc/PID/cwd and /proc/PID/environ the rest.

Light on purpose (no Flower import): `pubswap run` calls it before submitting.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

DEFAULT_PORT = "39091"  # flwr.cli.constant.LOCAL_SUPERLINK_HTTP_API_PORT
PORT_ENV = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
LOCAL_ADDRESSES = (":local:", ":local-in-memory:")  # flwr.cli.constant: a managed local SuperLink
NO_INSTALL_ENV = "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"
# variables whose value changes what a run reads or where it writes (the SuperLink's, not this shell's, apply)
COMPARED_PREFIXES = ("PUBSWAP_", "HF_", "MLFLOW_", "WANDB_")
# outside the checkout: Flower keeps its app store under FLWR_HOME, and a folder inside the checkout went into every
# later app bundle (1.8 -> 5.2 -> 12 MB; the fourth run was refused)
OWN_SUPERLINK = ("export FLWR_HOME=$HOME/.flwr-pubswap FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=39191 "
                 "FLWR_LOCAL_CONTROL_API_PORT=39193")
_LISTEN = "0A"  # /proc/net/tcp state of a listening socket


@dataclass(frozen=True)
class Process:
    """What /proc shows of a process: its command line, working directory and environment."""

    pid: int
    argv: list[str]
    cwd: Path
    environ: dict[str, str] = field(default_factory=dict)


def flwr_home(env: Mapping[str, str]) -> Path:
    """$FLWR_HOME, else ~/.flwr (flwr.supercore.utils.get_flwr_home)."""
    return Path(env.get("FLWR_HOME") or Path.home() / ".flwr").expanduser()


def local_port(env: Mapping[str, str]) -> int:
    return int(env.get(PORT_ENV) or DEFAULT_PORT)


def is_local_connection(connection: str | None, env: Mapping[str, str]) -> bool:
    """Whether `flwr run` with this connection name (None: the default one) uses the managed local SuperLink: its
    address in $FLWR_HOME/config.toml is `:local:`; Flower writes a config whose default is local when there is none."""
    path = flwr_home(env) / "config.toml"
    try:
        with path.open("rb") as handle:
            superlinks = tomllib.load(handle).get("superlink", {})
    except (OSError, tomllib.TOMLDecodeError):
        return connection in (None, "local")
    name = connection or superlinks.get("default")
    entry = superlinks.get(name) if isinstance(name, str) else None
    return isinstance(entry, dict) and entry.get("address") in LOCAL_ADDRESSES


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listener(port: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of this user's process listening on TCP `port`, or None (nothing listens, it is another user's
    process, or there is no /proc)."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port, proc)}
    if not sockets:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in sockets for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # another user's process, or one that just ended
            continue
    return None


def inspect(pid: int, proc: Path = Path("/proc")) -> Process | None:
    """The process's command line, working directory and environment; None when it cannot be read."""
    base = proc / str(pid)
    try:
        argv = [a for a in (base / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
        cwd = Path(os.readlink(base / "cwd"))
        raw = (base / "environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    environ = dict(item.split("=", 1) for item in raw if "=" in item)
    return Process(pid, argv, cwd, environ)


def bin_dir(process: Process) -> Path | None:
    """The directory of the `flower-superlink` the process runs (the venv's bin), from its command line: a console
    script runs as `<venv>/bin/python <venv>/bin/flower-superlink ...`."""
    for arg in process.argv[:2]:
        if Path(arg).name == "flower-superlink":
            path = Path(arg)
            return Path(os.path.normpath(path if path.is_absolute() else process.cwd / path)).parent
    return None


def installed_from(prefix: Path) -> Path | None:
    """The checkout an environment's editable pubswap-flwr install points at (its direct_url.json), if any."""
    for info in sorted(prefix.glob("lib/python*/site-packages/pubswap_flwr-*.dist-info/direct_url.json")):
        try:
            url = json.loads(info.read_text()).get("url", "")
        except (OSError, json.JSONDecodeError):
            continue
        if url.startswith("file://"):
            return Path(url[len("file://"):])
    return None


def _same(a: Path | None, b: Path | None) -> bool:
    return a is not None and b is not None and os.path.realpath(a) == os.path.realpath(b)


def _compared(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(COMPARED_PREFIXES)}


def differences(process: Process, env: Mapping[str, str], cwd: Path,
                bin_path: Path = Path(sys.executable).parent) -> list[str]:
    """How the SuperLink `process` would run an app differently from a SuperLink that this command (environment
    `env`, working directory `cwd`, venv bin `bin_path`) starts: one line each; [] when it would not."""
    out = []
    theirs = bin_dir(process)
    if not _same(theirs, bin_path):
        source = installed_from(theirs.parent) if theirs is not None else None
        out.append(f"environment: {theirs or ' '.join(process.argv[:2]) or 'unknown'}, not this command's "
                   f"{bin_path}: the app runs with that environment's Python packages"
                   + (f" and reads data/ (embedded models) from its pubswap-flwr install in {source}"
                      if source else ""))
    if not _same(process.cwd, cwd):
        out.append(f"started in {process.cwd}, not {cwd}: relative paths in the run config resolve there")
    if process.environ.get(NO_INSTALL_ENV) != "1":
        out.append(f"started without {NO_INSTALL_ENV}=1: every run installs the app's dependencies into a fresh "
                   "environment first (~40 s, and it may swap torch)")
    if not _same(flwr_home(process.environ), flwr_home(env)):
        out.append(f"its FLWR_HOME is {flwr_home(process.environ)}, not {flwr_home(env)}")
    theirs_env, ours_env = _compared(process.environ), _compared(env)
    for name in sorted(set(theirs_env) | set(ours_env)):
        if theirs_env.get(name) != ours_env.get(name):
            out.append(f"{name} is {theirs_env[name]!r} there" if name in theirs_env else f"{name} is unset there")
            out[-1] += f", {ours_env[name]!r} here" if name in ours_env else ", unset here"
    return out


def mismatch_warning(env: Mapping[str, str], cwd: Path | None = None, proc: Path = Path("/proc"),
                     bin_path: Path = Path(sys.executable).parent) -> str | None:
    """The warning to print before `flwr run` submits to the local SuperLink, or None when none is running (this
    command will start one from its own environment), it cannot be inspected, or it matches this command."""
    port = local_port(env)
    pid = listener(port, proc)
    process = inspect(pid, proc) if pid is not None else None
    if process is None:
        return None
    lines = differences(process, env, cwd or Path.cwd(), bin_path)
    if not lines:
        return None
    return "\n".join(
        [f"warning: the local SuperLink on 127.0.0.1:{port} (pid {pid}), which will run this app, was started from "
         "another checkout or environment:"] + [f"  - {line}" for line in lines]
        + [f"  To give this checkout its own SuperLink: {OWN_SUPERLINK} (ports no other checkout uses), then run "
           f"again. Or, when `flwr ls` shows none of its runs pending or running, stop it (`kill {pid}`) and the "
           "next run starts one from this environment."])
