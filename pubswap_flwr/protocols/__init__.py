"""The protocol registry: `strategy.mode` -> the protocol that owns both sides of that mode's exchange.

A protocol is a module with
- its messages: frozen dataclasses. Instructions (server -> client) subclass `base.Instruction`: a
  `message_type` (`train.<action>` or `query.<action>`), `to_record()` and `from_record(content)`. Replies have
  `to_record()` for the client and a `from_message(message, ...)` decoder for the server that checks everything
  (it may take what the server expects, e.g. the prompt ids it asked about) and carries a `report: ClientReport`;
- its server side: a `ServerProtocol` subclass whose `run_round(ctx)` sends instructions through
  `ctx.exchange.send(messages, decode)` (every reply enters there, through the per-reply guard) and records what
  happened in `ctx.log`; `state()` (JSON) and `saved_adapters()` (named arrays) for what its checkpoint
  must keep, `restore()` to take both back;
- its client side: `HANDLERS`, message type -> `handler(work: ClientWork) -> RecordDict` (`base.serve` loads the
  node's learner and state around it).

To add a mode:
1. write `protocols/<mode>.py` like fedavg.py (the smallest);
2. add its class to `PROTOCOLS` and its `HANDLERS` to `_HANDLER_OWNERS` below (message types must be unique: a
   duplicate is an error at import), the mode's name to `config.MODES` and its message types to
   `nodeapp.MESSAGE_TYPES`, the ClientApp's routing table (tests check that each pair agrees);
3. add its settings as a config section and any cross-key checks to `ExperimentConfig.validate`;
4. tests: a golden run (tests/golden/runs.py), its message flow in tests/protocols/test_rounds.py, its honest fake
   reply in tests/protocols/fake_clients.py and its mode in tests/protocols/test_properties.py;
5. docs/protocols.md: its row in the messages table.
A subclass serves its parent's message types too (FedProx is FedAvg with mu).
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

from ..config import ExperimentConfig
from .base import ClientHandler, ServerProtocol, serve
from . import fedavg, pubswap, sapo
from .fedavg import FedAvgProtocol, FedProxProtocol
from .pubswap import PubSwapProtocol
from .sapo import SapoProtocol

PROTOCOLS: dict[str, type[ServerProtocol]] = {
    "fedavg": FedAvgProtocol,
    "fedprox": FedProxProtocol,
    "pubswap": PubSwapProtocol,
    "sapo": SapoProtocol,
}

# each protocol module's handlers, with the protocol class whose messages they serve
_HANDLER_OWNERS = [(fedavg.HANDLERS, FedAvgProtocol), (pubswap.HANDLERS, PubSwapProtocol),
                   (sapo.HANDLERS, SapoProtocol)]


def _client_handlers() -> dict[str, tuple[ClientHandler, type[ServerProtocol]]]:
    table: dict[str, tuple[ClientHandler, type[ServerProtocol]]] = {}
    for handlers, owner in _HANDLER_OWNERS:
        for message_type, handler in handlers.items():
            if message_type in table:
                raise ValueError(f"message type {message_type!r} of {owner.__name__} is already served by "
                                 f"{table[message_type][1].__name__}")
            table[message_type] = (handler, owner)
    return table


# message type -> (handler, the protocol class whose messages it serves)
CLIENT_HANDLERS = _client_handlers()


def protocol_class(mode: str) -> type[ServerProtocol]:
    try:
        return PROTOCOLS[mode]
    except KeyError:
        raise ValueError(f"unknown strategy.mode {mode!r}; expected one of {sorted(PROTOCOLS)}") from None


def run_protocol(cfg: ExperimentConfig) -> type[ServerProtocol]:
    """The protocol of this run's mode (client handlers use it for mode-wide settings such as FedProx's mu)."""
    return protocol_class(cfg.strategy.mode)


def register_client_handlers(app: ClientApp, run_config: dict | None = None, wrap=None) -> ClientApp:
    """Register every protocol's handlers on `app`, routed by Flower message type. `run_config` replaces
    context.run_config (in-process simulation); `wrap(entry)` may wrap each entry (tests inject failures)."""
    for message_type, (handler, owner) in CLIENT_HANDLERS.items():
        entry = serve(handler, owner, run_protocol, run_config)
        category, action = message_type.split(".")
        getattr(app, category)(action)(wrap(entry) if wrap else entry)
    return app


__all__ = ["CLIENT_HANDLERS", "PROTOCOLS", "ServerProtocol", "protocol_class", "register_client_handlers",
           "run_protocol"]
