"""A warm worker per deployed node: one long-lived local process that keeps the model loaded between messages.

Flower 1.42 starts a fresh `flwr-clientapp` process for every message (docs/deployment.md, "Why a worker"), which
imports torch and loads the model each time. With `deploy.warm-worker = true` (the default) the ClientApp of a
deployed node forwards each message to its worker instead and returns the worker's reply:

    flwr-clientapp (one per message) ──unix socket, owner-only──▶ worker (one per node)
                                                                   ├─ python -m pubswap_flwr.node.warm.worker
                                                                   └─ the same protocol handlers as the per-message path

- `framing.py`: the bytes on the socket (length-prefixed frames: JSON headers, Flower's protobuf for the message
  and context; nothing is ever unpickled);
- `client.py`: the ClientApp side: where the socket lives, start the worker on first use or when it has died,
  send one message, return the reply;
- `worker.py`: the worker process: serves one message at a time with the in-process handlers, exits when idle for
  `deploy.worker-idle-timeout` or when the Flower process that launches ClientApps (its watch pid) is gone.

Node state stays on disk exactly as on the per-message path (every message reloads it from the state dir), so the
two paths give identical results and a killed worker loses nothing.

This package imports neither torch nor the protocols (the ClientApp side must start fast); only `worker.py` does,
when it runs.
"""

import os
import socket


def supported() -> bool:
    """Unix sockets and file locks exist here (not on Windows); elsewhere nodes use the per-message path."""
    return hasattr(socket, "AF_UNIX") and os.name == "posix"
