"""The protocols: one module per mode family (fedavg.py, local.py, pubswap.py, sapo.py), each owning both sides of
its exchange, declared once in config/catalog.py. This package is light to import: the catalog loads neither torch nor
Flower, and the names below that need the protocol modules load them when first used.

A protocol module has
- its messages: frozen dataclasses. Instructions (server -> client) subclass `records.Instruction`: a
  `message_type` (`train.<action>` or `query.<action>`) and its config keys declared once as its `config` (an
  `records.InstructionConfig`), from which `to_record()` and `from_record(content)` derive. Replies have
  `to_record()` for the client and a `from_message(message, ...)` decoder for the server that checks everything
  (it may take what the server expects, e.g. the prompt ids it asked about) and carries a `report: ClientReport`;
- its server side: a `ServerProtocol` subclass whose `run_round(ctx)` sends instructions through
  `ctx.exchange.send(messages, decode)` (every reply enters there, through the per-reply guard) and records what
  happened in `ctx.log`; `state()` (JSON) and `saved_adapters()` (named arrays) for what its checkpoint
  must keep, `restore()` to take both back;
- its client side: one handler per message type, `handler(work: ClientWork) -> RecordDict` (node_runtime/serving.py's
  `serve` loads the node's learner and state around it), named in its catalog entry.
config/catalog.py says how to add a mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import catalog

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp

    from ..config import ExperimentConfig
    from .base import ServerProtocol


def protocol_class(mode: str) -> "type[ServerProtocol]":
    """The server class of `mode` (its module imported now); ValueError for a mode the catalog does not know."""
    return catalog.load(catalog.protocol(mode).modes[mode])


def run_protocol(cfg: "ExperimentConfig") -> "type[ServerProtocol]":
    """The protocol of this run's mode (client handlers use it for mode-wide settings such as FedProx's mu)."""
    return protocol_class(cfg.strategy.mode)


def client_handlers() -> dict[str, tuple[Any, catalog.Protocol]]:
    """Message type -> (its handler, the family whose modes may receive it), every handler imported now."""
    return {t: (catalog.load(catalog.owner(t).handlers[t]), catalog.owner(t)) for t in catalog.message_types()}


def register_client_handlers(app: "ClientApp", run_config: dict | None = None, wrap=None) -> "ClientApp":
    """Register every protocol's handlers on `app`, routed by Flower message type. `run_config` replaces
    context.run_config (in-process simulation); `wrap(entry)` may wrap each entry (tests inject failures)."""
    from ..node_runtime.serving import serve

    for message_type, (handler, owner) in client_handlers().items():
        entry = serve(handler, tuple(owner.modes), run_protocol, run_config,
                      owner.section[0] if owner.section else None)
        category, action = message_type.split(".")
        getattr(app, category)(action)(wrap(entry) if wrap else entry)
    return app


def __getattr__(name: str) -> Any:
    """PROTOCOLS (mode -> server class), CLIENT_HANDLERS (see client_handlers) and ServerProtocol, loaded on use."""
    if name == "PROTOCOLS":
        return {mode: protocol_class(mode) for mode in catalog.modes()}
    if name == "CLIENT_HANDLERS":
        return client_handlers()
    if name == "ServerProtocol":
        from .base import ServerProtocol

        return ServerProtocol
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CLIENT_HANDLERS", "PROTOCOLS", "ServerProtocol", "catalog", "client_handlers", "protocol_class",
           "register_client_handlers", "run_protocol"]
