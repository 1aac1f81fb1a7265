"""Which local SuperLink a `flwr run` will reach, and whether it runs apps in another checkout or environment.

Flower 1.42's CLI reaches the local SuperLink by port (127.0.0.1:$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT, default 39091)
and starts one only when none answers there; a running one is shared by every checkout and terminal on the machine.
It runs a submitted app with its own environment: the Python and packages (and pubswap-flwr install, whose data/ the
app reads) of the venv it was started from, its working directory (relative paths in the run config resolve there)
and its environment variables. The process listening on the port is found through /proc (Linux, own processes only):
its command line names the `flower-superlink` it runs, and /proc/PID/cwd and /proc/PID/environ the rest.

By default `pubswap run` gives each checkout a SuperLink of its own (own_link): FLWR_HOME under the user's data
directory, keyed by the checkout's resolved path, and two ports recorded there, so two checkouts never cross. The
machine-wide one (~/.flwr, 39091) only when asked, or when the user set FLWR_HOME or the port variables.

Light on purpose (no Flower import): `pubswap run` calls it before submitting.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import socket
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

DEFAULT_PORT = "39091"  # flwr.cli.constant.LOCAL_SUPERLINK_HTTP_API_PORT
PORT_ENV = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
DEFAULT_CONTROL_PORT = "39093"  # flwr.cli.constant.LOCAL_CONTROL_API_PORT
CONTROL_PORT_ENV = "FLWR_LOCAL_CONTROL_API_PORT"
USER_VARIABLES = ("FLWR_HOME", PORT_ENV, CONTROL_PORT_ENV)  # set by the user: their choice of SuperLink is kept
OWN_HOMES = Path("pubswap") / "superlink"  # under $XDG_DATA_HOME (~/.local/share): one folder per checkout
RECORD_FILE = "ports.json"  # the own SuperLink's two ports, in its home
SUBMITTED_FILE = "submitted.json"  # the runs `pubswap run` submitted from this checkout and has not seen finish
LOCK_FILE = "lock"
# Ports are chosen below Linux's ephemeral range (32768-60999), where outgoing connections take theirs, starting at
# a place derived from the checkout's id.
PORT_RANGE = (20000, 32000)
FINISHED = "finished:"
LOCAL_ADDRESSES = (":local:", ":local-in-memory:")  # flwr.cli.constant: a managed local SuperLink
NO_INSTALL_ENV = "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"
# variables whose value changes what a run reads or where it writes (the SuperLink's, not this shell's, apply)
COMPARED_PREFIXES = ("PUBSWAP_", "HF_", "MLFLOW_", "WANDB_")
# outside the checkout: Flower keeps its app store under FLWR_HOME, and a folder inside the checkout went into every
# later app bundle (1.8 -> 5.2 -> 12 MB; the fourth run was refused)
OWN_ADVICE = ("To give this checkout its own SuperLink: run `pubswap run` without --shared-superlink and with "
              "FLWR_HOME, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and FLWR_LOCAL_CONTROL_API_PORT unset (it picks a home "
              "and ports of this checkout's own).")
_LISTEN = "0A"  # /proc/net/tcp state of a listening socket
log = logging.getLogger(__name__)


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
                     bin_path: Path = Path(sys.executable).parent, advice: str | None = None) -> str | None:
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
        + [f"  {advice or OWN_ADVICE} Or, when `flwr ls` shows none of its runs pending or running, stop it "
           f"(`kill {pid}`) and the next run starts one from this environment."])


# -- a SuperLink of this checkout's own --------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A local SuperLink that `flwr` reaches through these variables: its FLWR_HOME, HTTP API port and control port,
    and whose it is: `own` (this checkout's), `given` (the user's FLWR_HOME / port variables) or `shared` (the
    machine-wide one, ~/.flwr on 39091)."""

    home: Path
    port: int
    control_port: int
    kind: str = field(default="given", compare=False)

    def env(self) -> dict[str, str]:
        return {"FLWR_HOME": str(self.home), PORT_ENV: str(self.port), CONTROL_PORT_ENV: str(self.control_port)}

    def prefix(self) -> str:
        """The variables as a shell prefix, for the commands printed for the user."""
        return " ".join(f"{name}={shlex.quote(value)}" for name, value in self.env().items())

    @property
    def name(self) -> str:
        return {"own": "this checkout's own SuperLink", "shared": "the machine-wide SuperLink"}.get(
            self.kind, "the SuperLink of your FLWR_HOME / port variables")


def describe(link: Link, proc: Path = Path("/proc")) -> str:
    """One line: which SuperLink, where, and whether it runs."""
    pid = serving_pid(link, proc)
    if pid is not None:
        state = f"running, pid {pid}"
    elif serves(link, proc):
        state = "port in use (without /proc its process is not checked)"
    else:
        state = "not running"
    return f"{link.name} on 127.0.0.1:{link.port} (FLWR_HOME={link.home}): {state}"


def checkout_id(app: str | Path) -> str:
    """A short id of the checkout's resolved path, stable across runs."""
    return hashlib.sha256(str(Path(app).expanduser().resolve()).encode()).hexdigest()[:12]


def own_home(app: str | Path, env: Mapping[str, str]) -> Path:
    """($XDG_DATA_HOME or ~/.local/share)/pubswap/superlink/<checkout id>: outside the checkout (a home inside it
    went into every app bundle)."""
    base = Path(env.get("XDG_DATA_HOME") or Path(env.get("HOME") or Path.home()) / ".local" / "share").expanduser()
    return base / OWN_HOMES / checkout_id(app)


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1024 <= value <= 65535


def _read_json(path: Path) -> tuple[Any, str | None]:
    """(content, None), or (None, the problem); (None, None) when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as err:
        return None, f"unreadable ({err})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError:
        return None, "not JSON"


def _ports_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "not an object"
    for key in ("port", "control-port"):
        if not _is_port(data.get(key)):
            return f"{key!r} is not a port number"
    return "the two ports are the same" if data["port"] == data["control-port"] else None


def recorded_ports(home: Path, quiet: bool = False) -> tuple[int, int] | None:
    """The (HTTP API, control) ports recorded in `home`, or None: none recorded, or a bad record (logged unless
    `quiet`). The file is untrusted input: anyone who can write the data directory can write it."""
    path = home / RECORD_FILE
    data, problem = _read_json(path)
    if problem is None and data is not None:
        problem = _ports_problem(data)
    if problem is not None:
        if not quiet:
            log.warning("%s: %s; choosing ports again", path, problem)
        return None
    return None if data is None else (data["port"], data["control-port"])


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def _has_proc(proc: Path) -> bool:
    return (proc / "net" / "tcp").is_file()


def port_free(port: int, proc: Path = Path("/proc")) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` (any user's process): no listening socket in /proc and a bind
    succeeds (SO_REUSEADDR: a closed connection's TIME_WAIT does not count)."""
    if _has_proc(proc) and _listening_inodes(port, proc):
        return False
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _held_by(port: int, home: Path, proc: Path) -> int | None:
    """The pid of the flower-superlink with FLWR_HOME `home` that listens on `port`, else None."""
    pid = listener(port, proc)
    process = inspect(pid, proc) if pid is not None else None
    if process is None or bin_dir(process) is None:
        return None
    return pid if _same(flwr_home(process.environ), home) else None


def serving_pid(link: Link, proc: Path = Path("/proc")) -> int | None:
    """The pid of the flower-superlink with this link's FLWR_HOME that listens on its port, else None (nothing listens,
    or another process: another user's, another program, a SuperLink of another home)."""
    return _held_by(link.port, link.home, proc)


def serves(link: Link, proc: Path = Path("/proc")) -> bool:
    """Whether this link's SuperLink runs. Without /proc its holder cannot be seen: whatever listens on the port."""
    return serving_pid(link, proc) is not None if _has_proc(proc) else not port_free(link.port, proc)


def _holder(port: int, proc: Path) -> str:
    pid = listener(port, proc)
    process = inspect(pid, proc) if pid is not None else None
    if process is None:
        return "not one of this user's processes"
    return f"pid {pid}: {' '.join(process.argv[:3])[:200]}"


def _other_checkouts_ports(home: Path) -> set[int]:
    try:
        siblings = [entry for entry in home.parent.iterdir() if entry.is_dir() and entry != home]
    except FileNotFoundError:
        return set()
    return {port for entry in siblings for port in (recorded_ports(entry, quiet=True) or ())}


def _choose(start: int, avoid: set[int], proc: Path) -> int:
    low, high = PORT_RANGE
    for step in range(high - low):
        port = low + (start + step) % (high - low)
        if port not in avoid and port_free(port, proc):
            return port
    raise RuntimeError(f"no free port between {low} and {high} on 127.0.0.1")


def own_link(app: str | Path, env: Mapping[str, str], proc: Path = Path("/proc")) -> Link:
    """This checkout's own SuperLink: its home, and the ports recorded there while each is free or held by that
    SuperLink; a port held by another process, or recorded by another checkout, is chosen again (logged), as are both
    when the record is missing or bad. Where there is no /proc the holder of a port cannot be seen and a recorded port
    in use is taken to be this SuperLink's."""
    home = own_home(app, env)
    path = home / RECORD_FILE
    recorded = recorded_ports(home)
    others = _other_checkouts_ports(home)
    kept: list[int | None] = []
    for port in recorded or (None, None):
        if port is None:
            kept.append(None)
        elif port in others:
            log.warning("port %d recorded in %s is recorded by another checkout too; choosing another", port, path)
            kept.append(None)
        elif port_free(port, proc) or not _has_proc(proc) or _held_by(port, home, proc) is not None:
            kept.append(port)
        else:
            log.warning("port %d recorded in %s is held by another process (%s); choosing another", port, path,
                        _holder(port, proc))
            kept.append(None)
    start = int(checkout_id(app), 16) % (PORT_RANGE[1] - PORT_RANGE[0])
    chosen: list[int] = []
    for port in kept:
        chosen.append(port if port is not None else
                      _choose(start, others | {p for p in kept if p is not None} | set(chosen), proc))
    link = Link(home, chosen[0], chosen[1], kind="own")
    if (link.port, link.control_port) != recorded:
        _write(path, {"checkout": str(Path(app).expanduser().resolve()), "port": link.port,
                      "control-port": link.control_port})
    return link


def link_for(app: str | Path, env: Mapping[str, str], shared: bool = False, proc: Path = Path("/proc")) -> Link:
    """The local SuperLink `pubswap run` uses: the one the user's FLWR_HOME / port variables name when set, the
    machine-wide one when `shared`, else this checkout's own."""
    given = any(env.get(name) for name in USER_VARIABLES)
    if given or shared:
        return Link(flwr_home(env), local_port(env), int(env.get(CONTROL_PORT_ENV) or DEFAULT_CONTROL_PORT),
                    kind="given" if given else "shared")
    return own_link(app, env, proc)


# -- the runs submitted from this checkout -------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """A run `pubswap run` submitted from this checkout, and the SuperLink it went to."""

    run_id: str
    link: Link

    def as_json(self) -> dict[str, Any]:
        return {"run-id": self.run_id, "flwr-home": str(self.link.home), "port": self.link.port,
                "control-port": self.link.control_port, "kind": self.link.kind}


def _submitted_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        return "not an object with a list 'runs'"
    for index, entry in enumerate(data["runs"]):
        where = f"runs[{index}]"
        if not isinstance(entry, dict):
            return f"{where} is not an object"
        run_id = entry.get("run-id")
        if not (isinstance(run_id, str) and run_id.isascii() and run_id.isdigit() and len(run_id) <= 20):
            return f"{where}: 'run-id' is not a run id"
        home = entry.get("flwr-home")
        if not (isinstance(home, str) and Path(home).is_absolute()):
            return f"{where}: 'flwr-home' is not an absolute path"
        if (problem := _ports_problem(entry)) is not None:
            return f"{where}: {problem}"
        if entry.get("kind", "given") not in ("own", "given", "shared"):
            return f"{where}: 'kind' is not own, given or shared"
    return None


def read_submitted(home: Path) -> list[Submitted]:
    """The runs recorded as submitted from this checkout; [] when none, or when the record is bad (logged: it is
    untrusted input, and a run missing from it only means no refusal)."""
    path = home / SUBMITTED_FILE
    data, problem = _read_json(path)
    if problem is None and data is not None:
        problem = _submitted_problem(data)
    if problem is not None:
        log.warning("%s: %s; the record is started again", path, problem)
        return []
    if data is None:
        return []
    return [Submitted(entry["run-id"], Link(Path(entry["flwr-home"]), entry["port"], entry["control-port"],
                                            kind=entry.get("kind", "given"))) for entry in data["runs"]]


def write_submitted(home: Path, runs: list[Submitted]) -> None:
    _write(home / SUBMITTED_FILE, {"runs": [run.as_json() for run in runs]})


def in_flight(runs: list[Submitted], statuses: Callable[[Link], dict[str, str] | None]
              ) -> tuple[list[tuple[Submitted, str]], list[Submitted]]:
    """(the runs not finished with their status, the runs to keep recording: those and the ones whose SuperLink could
    not be asked). `statuses(link)` is the SuperLink's {run id: status}, {} when it no longer runs, None when it could
    not be asked; a run missing from it is gone (its SuperLink was restarted without it)."""
    asked: dict[Link, dict[str, str] | None] = {}
    running, keep = [], []
    for run in runs:
        if run.link not in asked:
            asked[run.link] = statuses(run.link)
        listing = asked[run.link]
        if listing is None:
            log.warning("could not ask %s on 127.0.0.1:%d whether run %s still runs; not counted as running",
                        run.link.name, run.link.port, run.run_id)
            keep.append(run)
        elif run.run_id in listing and not listing[run.run_id].startswith(FINISHED):
            running.append((run, listing[run.run_id]))
            keep.append(run)
    return running, keep


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """Held while a `pubswap run` checks for runs in flight, submits and records its run: two started together do
    not both pass the check."""
    import fcntl  # POSIX only: imported where used, so the module still imports elsewhere

    home.mkdir(parents=True, exist_ok=True)
    with (home / LOCK_FILE).open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
