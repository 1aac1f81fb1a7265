"""The ClientApp side of a node's warm worker: where its socket lives, starting it on first use or after it died,
and handing it one message.

The socket, its lock, the worker's pid file and log live in one directory that only this user may enter (mode
0700, checked on every message: a directory that is a link, another user's, or open to others is refused). It is
`$PUBSWAP_WORKER_DIR`, else the first usable of `$XDG_RUNTIME_DIR/pubswap-workers`, `<tmp>/pubswap-workers-<uid>`
(another local user may have created it first) and `~/.pubswap/workers`. The socket itself is 0600 and the worker
also refuses a peer of another user (SO_PEERCRED, where the platform has it). When no worker can be reached or
started (`WorkerUnavailable`), the node serves the message in its own process.

One worker serves one node of one Flower process tree: its name hashes the code directory, the Python, the watch
pid (the process that launches ClientApps: a SuperNode's `flower-superexec`), the Flower node id and the
node-config. New code (another FAB), a restarted SuperNode or another organization's node on the same host gets
its own worker; the old one exits when its watch pid is gone or after `deploy.worker-idle-timeout`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from flwr.app import Context, Message

from ...untrusted import NotOwnedError, check_owned_dir
from .framing import PROTOCOL, ConnectionClosed, recv_json, recv_message, send_context, send_json, send_message

log = logging.getLogger("pubswap_flwr")

RUNTIME_DIR_ENV = "PUBSWAP_WORKER_DIR"
START_TIMEOUT = 600.0  # seconds a new worker may take to serve its first connection (imports, model load)
SOCKET_PATH_MAX = 100  # sun_path holds 104 (macOS) to 108 (Linux) bytes with its terminating NUL
CODE_DIR = Path(__file__).resolve().parents[3]  # the directory holding this pubswap_flwr package (a FAB or checkout)
WORKER_MODULE = "pubswap_flwr.node.warm.worker"


class WorkerError(RuntimeError):
    """The warm worker could not be reached or started, its handler raised, or it died during the message."""


class WorkerUnavailable(WorkerError):
    """No worker could be reached or started, and nothing of the message was sent: the node can serve the message
    in its own process instead (node/app.py:route does, with a warning)."""


# -- where a worker lives ----------------------------------------------------------------------------------------
def check_private_dir(path: Path) -> None:
    """Refuse a worker directory that someone else could reach: a link, not ours, or open to group/others."""
    try:
        check_owned_dir(path, forbidden_mode=0o077)
    except NotOwnedError as err:
        hint = {"link": "", "owner": f"; set ${RUNTIME_DIR_ENV} to a directory of your own",
                "mode": f": others could reach the worker's socket; `chmod 700 {path}` or set ${RUNTIME_DIR_ENV}"}
        raise WorkerError(f"warm worker directory {err}{hint[err.kind]}") from None


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)
    return path


def runtime_dir() -> Path:
    """The owner-only directory of this user's workers (created 0700 when missing, checked every time):
    `$PUBSWAP_WORKER_DIR` when set, else the first usable of `$XDG_RUNTIME_DIR/pubswap-workers`,
    `<tmp>/pubswap-workers-<uid>` (which another local user may have created first) and `~/.pubswap/workers`.
    WorkerUnavailable names what was wrong with each."""
    configured = os.environ.get(RUNTIME_DIR_ENV)
    if configured:
        try:
            return _private_dir(Path(configured).expanduser())
        except (OSError, WorkerError) as err:
            raise WorkerUnavailable(f"${RUNTIME_DIR_ENV}: {err}") from None
    candidates = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        candidates.append(lambda: Path(xdg) / "pubswap-workers")
    candidates += [lambda: Path(tempfile.gettempdir()) / f"pubswap-workers-{os.getuid()}",
                   lambda: Path.home() / ".pubswap" / "workers"]
    problems = []
    for candidate in candidates:
        try:
            return _private_dir(candidate())
        except (OSError, RuntimeError) as err:  # WorkerError; OSError from mkdir; RuntimeError: no home directory
            problems.append(str(err))
            log.warning("warm worker directory refused, trying the next: %s", err)
    raise WorkerUnavailable("no usable warm worker directory: " + "; ".join(problems))


@dataclass(frozen=True)
class WorkerAddress:
    """One worker's files: socket, start lock, pid file and log, named by its key."""

    directory: Path
    key: str

    @property
    def socket(self) -> Path:
        return self.directory / f"{self.key}.sock"

    @property
    def lock_file(self) -> Path:
        return self.directory / f"{self.key}.lock"

    @property
    def pid_file(self) -> Path:
        return self.directory / f"{self.key}.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / f"{self.key}.log"


def address_for(context: Context, watch_pid: int) -> WorkerAddress:
    """The worker of this node (see the module docstring for what its key covers)."""
    node_config = sorted((str(k), str(v)) for k, v in context.node_config.items())
    identity = json.dumps([str(CODE_DIR), sys.executable, watch_pid, context.node_id, node_config])
    address = WorkerAddress(runtime_dir(), hashlib.sha256(identity.encode()).hexdigest()[:24])
    if len(os.fsencode(address.socket)) > SOCKET_PATH_MAX:
        raise WorkerUnavailable(f"warm worker socket path {address.socket} is longer than {SOCKET_PATH_MAX} bytes (the "
                                f"unix socket limit); set ${RUNTIME_DIR_ENV} to a shorter directory")
    return address


# -- reaching it -------------------------------------------------------------------------------------------------
def _owner_only(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_CREAT, 0o600)


@contextlib.contextmanager
def _start_lock(address: WorkerAddress) -> Iterator[None]:
    """Held while checking for and starting a worker, so two ClientApps of one node never start two."""
    fd = _owner_only(address.lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _try_connect(address: WorkerAddress) -> socket.socket | None:
    """A connection the worker has taken (its hello received), or None when no worker serves this socket. Waits
    while the worker is busy with another message or still loading."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(address.socket))
        hello = recv_json(sock)
    except (FileNotFoundError, ConnectionError):  # no socket, nobody listening, or closed before taking us
        sock.close()
        return None
    if hello.get("worker") != PROTOCOL:
        sock.close()
        raise WorkerUnavailable(f"{address.socket} answers with worker protocol {hello.get('worker')!r}, not "
                                f"{PROTOCOL}")
    return sock


def _log_tail(address: WorkerAddress, chars: int = 2000) -> str:
    try:
        return address.log_file.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _start(address: WorkerAddress, watch_pid: int, idle_timeout: float) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CODE_DIR), env.get("PYTHONPATH", "")) if p)
    log_fd = _owner_only(address.log_file, os.O_WRONLY | os.O_APPEND)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE, "--socket", str(address.socket), "--watch-pid", str(watch_pid),
             "--idle-timeout", repr(idle_timeout)],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        os.close(log_fd)


def connect(address: WorkerAddress, watch_pid: int, idle_timeout: float) -> socket.socket:
    """A connection to this node's worker, starting one when none answers (first use, or the last one died)."""
    sock = _try_connect(address)
    if sock is not None:
        return sock
    with _start_lock(address):
        sock = _try_connect(address)  # another ClientApp of this node may have started it meanwhile
        if sock is not None:
            return sock
        process = _start(address, watch_pid, idle_timeout)
        deadline = time.monotonic() + START_TIMEOUT
        while (sock := _try_connect(address)) is None:
            code = process.poll()
            if code is not None:
                raise WorkerUnavailable(f"the warm worker exited with code {code} before serving; its log "
                                        f"{address.log_file} ends:\n{_log_tail(address)}")
            if time.monotonic() > deadline:
                process.kill()
                raise WorkerUnavailable(f"the warm worker did not serve within {START_TIMEOUT:.0f} s; its log "
                                        f"{address.log_file} ends:\n{_log_tail(address)}")
            time.sleep(0.05)
        return sock


def call(message: Message, context: Context, *, idle_timeout: float, task_id: int | None = None,
         watch_pid: int | None = None) -> Message:
    """The reply of this node's worker to `message` (a Message built in the worker; take its content). The watch pid
    defaults to this process's parent, the Flower process that launched this ClientApp."""
    watch = os.getppid() if watch_pid is None else watch_pid
    address = address_for(context, watch)
    with connect(address, watch, idle_timeout) as sock:
        try:
            send_json(sock, {"task-id": task_id, "idle-timeout": idle_timeout})
            send_context(sock, context)
            send_message(sock, message)
            header = recv_json(sock)
            if not header.get("ok"):
                raise WorkerError(f"the node's handler failed in its warm worker (log {address.log_file}):\n"
                                  f"{header.get('error', 'no reason given')}")
            reply = recv_message(sock)
        except (ConnectionClosed, BrokenPipeError, ConnectionResetError) as err:
            raise WorkerError(f"the node's warm worker died while handling this message ({err}); the next message "
                              f"starts a new one from the node's state on disk. Its log {address.log_file} ends:\n"
                              f"{_log_tail(address)}") from None
    if reply.has_error():
        raise WorkerError(f"the node's warm worker replied with error {reply.error.code}: {reply.error.reason}")
    return reply
