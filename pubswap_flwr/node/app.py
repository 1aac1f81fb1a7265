"""The ClientApp of every node (client_app.py exports it): each protocol's message types, routed either to the
node's warm worker (a deployed node with `deploy.warm-worker`, see pubswap_flwr/warm) or to the protocol handlers
in this process (simulation, or the warm path off: Flower's fresh process per message loads the model itself).

Until a message needs the in-process handlers this module imports neither torch nor the protocol modules (only their
catalog, which names the message types), so a deployed node's per-message Flower process only reads the run config
and forwards the message.
"""

from __future__ import annotations

import functools
import logging

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from ..config import ExperimentConfig, catalog
from . import warm

log = logging.getLogger("pubswap_flwr")

MESSAGE_TYPES = catalog.message_types()  # every protocol's client message types


def is_simulated(node_config: dict) -> bool:
    """Flower sets `num-partitions` only for simulated nodes."""
    return "num-partitions" in node_config


@functools.cache
def in_process_app() -> ClientApp:
    from ..protocols import register_client_handlers  # torch and transformers: only when a message runs here

    return register_client_handlers(ClientApp())


def _task_id() -> int | None:
    try:
        return TaskIdentity.task_id
    except RuntimeError:  # not set outside Flower's ClientApp process (tests calling the app directly)
        return None


@functools.cache
def _warn_unsupported() -> None:
    log.warning("deploy.warm-worker: this platform has no unix sockets; every message loads the model in a fresh "
                "process")


def route(message: Message, context: Context) -> Message:
    """Serve `message` in this process or forward it to this node's warm worker."""
    cfg = ExperimentConfig.from_flat(context.run_config)
    if is_simulated(context.node_config) or not cfg.deploy.warm_worker:
        return in_process_app()(message, context)
    if not warm.supported():
        _warn_unsupported()
        return in_process_app()(message, context)
    from .warm import client

    try:
        reply = client.call(message, context, idle_timeout=cfg.deploy.worker_idle_timeout, task_id=_task_id())
    except client.WorkerUnavailable as err:  # nothing was sent: the message is served here instead
        log.warning("deploy.warm-worker: %s; serving this message in this process (it loads the model itself)",
                    " ".join(str(err).split())[:1000])
        return in_process_app()(message, context)
    return Message(reply.content, reply_to=message)


def build_client_app() -> ClientApp:
    app = ClientApp()
    for message_type in MESSAGE_TYPES:
        category, action = message_type.split(".")
        getattr(app, category)(action)(route)
    return app
