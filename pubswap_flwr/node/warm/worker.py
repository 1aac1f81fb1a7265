"""A node's warm worker process: serves its node's messages, one at a time, with the same in-process handlers the
per-message path runs, so the model stays loaded (`policy.cached_policy`) between messages.

    python -m pubswap_flwr.node.warm.worker --socket DIR/KEY.sock --watch-pid PID --idle-timeout SECONDS

Started by `client.connect` (never by hand). It binds its socket first (0600, in the owner-only directory), writes
its pid file, then imports torch and the protocols, then takes connections. It exits, removing its socket and pid
file, when no message came for the idle timeout (the latest request's `deploy.worker-idle-timeout`) or when the
watch pid has exited (the SuperNode's launcher, so a stopped SuperNode leaves no worker behind). Every message
reloads the node's state from its state dir, as on the per-message path: killing this process loses nothing.

Connections are served one at a time, so one that sends nothing would hold every other ClientApp of the node: a
connection whose request header has not come whole within HANDSHAKE_SECONDS of the hello is closed, with a warning.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

from flwr.app import Message
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from .client import check_private_dir
from .framing import PROTOCOL, FrameError, FrameTimeout, recv_context, recv_json, recv_message, send_json, send_message

log = logging.getLogger("pubswap_flwr.node.warm")
POLL_SECONDS = 1.0  # how often an idle worker checks its watch pid and idle deadline
# A ClientApp sends its whole request as soon as the worker takes the connection, and reads the reply as soon as it
# comes, over a local socket; a peer that has not done either within this is gone or hostile
REQUEST_SECONDS = 60.0
# The request's first frame (its small JSON header) follows the worker's hello at once; a connection that has not sent
# it whole within this sends nothing (or stalls): it is closed, since the worker serves one connection at a time and
# every other ClientApp of the node waits behind it. The context and message may take up to REQUEST_SECONDS.
HANDSHAKE_SECONDS = 5.0
PEER_GONE = (BrokenPipeError, ConnectionResetError, TimeoutError)  # what sending to a ClientApp that left raises


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED), or None where the platform does not tell."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def listen(path: Path) -> socket.socket:
    """Bind the socket owner-only. A leftover file is a dead worker's (the starter holds the start lock)."""
    check_private_dir(path.parent)
    if path.exists() or path.is_symlink():
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.umask(0o077)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    return listener


def serve_one(conn: socket.socket, app: ClientApp, request_seconds: float = REQUEST_SECONDS,
              handshake_seconds: float = HANDSHAKE_SECONDS) -> float | None:
    """Take one request on `conn` and answer it; the request's idle timeout, or None when it was unreadable or did
    not arrive in time: its header within `handshake_seconds`, all of it within `request_seconds` (a ClientApp sends
    it at once: a silent peer must not hold the worker). The reply must be taken within `request_seconds` too
    (socket.timeout otherwise, which `serve` logs)."""
    conn.settimeout(request_seconds)
    send_json(conn, {"worker": PROTOCOL, "pid": os.getpid()})
    taken = time.monotonic()
    handshake = min(handshake_seconds, request_seconds)
    missing = f"no request header within {handshake:g} s (HANDSHAKE_SECONDS; a ClientApp sends it at once)"
    try:
        header = recv_json(conn, taken + handshake)
        missing = f"no whole request within {request_seconds:g} s (REQUEST_SECONDS)"
        context = recv_context(conn, taken + request_seconds)
        message = recv_message(conn, taken + request_seconds)
    except FrameTimeout as err:
        log.warning("closed a connection that sent %s: %s", missing, str(err)[:300])
        return None
    except (ConnectionError, FrameError) as err:
        log.warning("dropped an unreadable request: %s: %s", type(err).__name__, str(err)[:300])
        return None
    conn.settimeout(request_seconds)
    idle = header.get("idle-timeout")
    task_id = header.get("task-id")
    TaskIdentity.run_id, TaskIdentity.node_id = context.run_id, context.node_id
    TaskIdentity.task_id = task_id if isinstance(task_id, int) else 0
    started = time.perf_counter()
    try:
        reply: Message = app(message, context)
    except Exception:  # noqa: BLE001 - relayed: the ClientApp raises it, and Flower turns it into an error reply
        log.warning("%s failed:\n%s", message.metadata.message_type, traceback.format_exc())
        send_json(conn, {"ok": False, "error": traceback.format_exc()})
    else:
        send_json(conn, {"ok": True})
        send_message(conn, reply)
        log.info("%s (run %d, node %d) served in %.2f s", message.metadata.message_type, context.run_id,
                 context.node_id, time.perf_counter() - started)
    if isinstance(idle, (int, float)) and not isinstance(idle, bool) and math.isfinite(idle) and idle > 0:
        return float(idle)
    return None


def serve(listener: socket.socket, app: ClientApp, watch_pid: int, idle_timeout: float) -> str:
    """Answer requests until idle or the watch pid is gone; returns why it stopped."""
    deadline = time.monotonic() + idle_timeout
    while True:
        ready, _, _ = select.select([listener], [], [], POLL_SECONDS)
        if not ready:
            if time.monotonic() > deadline:
                return f"idle for {idle_timeout:g} s"
            if watch_pid > 1 and not process_alive(watch_pid):
                return f"watch pid {watch_pid} exited"
            continue
        conn, _ = listener.accept()
        with conn:
            uid = peer_uid(conn)
            if uid is not None and uid != os.getuid():
                log.warning("refused a connection from uid %d", uid)
                continue
            try:
                idle_timeout = serve_one(conn, app) or idle_timeout
            except PEER_GONE as err:  # the ClientApp went away, or does not read; nothing to answer
                log.warning("the ClientApp left before its reply was sent (or did not take it within %g s): %s",
                            REQUEST_SECONDS, type(err).__name__)
        deadline = time.monotonic() + idle_timeout


def _remove_own(path: Path, pid_file: Path, inode: int) -> None:
    """Remove the socket and pid file if they are still this worker's (a successor may have replaced them)."""
    try:
        if os.stat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
    try:
        if pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
    except FileNotFoundError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--watch-pid", required=True, type=int)
    parser.add_argument("--idle-timeout", required=True, type=float)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a polite stop removes the socket and pid file too
    listener = listen(args.socket)
    inode = os.stat(args.socket).st_ino
    pid_file = args.socket.with_suffix(".pid")
    tmp = pid_file.with_suffix(".pid.tmp")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_file)
    try:
        started = time.perf_counter()
        from ...protocols import register_client_handlers  # torch, transformers: after the socket is up

        app = register_client_handlers(ClientApp())
        log.info("worker %d serving %s (watch pid %d), ready in %.1f s", os.getpid(), args.socket, args.watch_pid,
                 time.perf_counter() - started)
        reason = serve(listener, app, args.watch_pid, args.idle_timeout)
        log.info("worker %d exits: %s", os.getpid(), reason)
    finally:
        _remove_own(args.socket, pid_file, inode)  # first, so no new ClientApp connects to a closing worker
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
