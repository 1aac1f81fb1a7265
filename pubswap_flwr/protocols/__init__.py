"""The protocol registry: `strategy.mode` -> the protocol that owns both sides of that mode's exchange.

A protocol is a module with
- its messages: frozen dataclasses with a `message_type` (`train.<action>` or `query.<action>`), `to_record` and
  `from_record`, used by both sides;
- its server side: a `ServerProtocol` subclass whose `run_round(ctx)` sends instructions through `ctx.exchange`
  (every reply enters through the exchange's per-reply guard) and records what happened in `ctx.log`;
- its client side: `CLIENT_HANDLERS`, message type -> `handler(work) -> RecordDict`.

To add a mode: write `protocols/<mode>.py` like fedavg.py, add it to `PROTOCOLS` below and to
`config.MODES`, and give it a golden run (tests/golden/runs.py). The ClientApp registers every protocol's
handlers, so a mode's message types must be unique across protocols.
"""

from __future__ import annotations

from flwr.clientapp import ClientApp

from ..config import ExperimentConfig
from .base import ClientHandler, ServerProtocol, serve
from .fedavg import CLIENT_HANDLERS as FEDAVG_HANDLERS, FedAvgProtocol, FedProxProtocol
from .pubswap import CLIENT_HANDLERS as PUBSWAP_HANDLERS, PubSwapProtocol
from .sapo import CLIENT_HANDLERS as SAPO_HANDLERS, SapoProtocol

PROTOCOLS: dict[str, type[ServerProtocol]] = {
    "fedavg": FedAvgProtocol,
    "fedprox": FedProxProtocol,
    "pubswap": PubSwapProtocol,
    "sapo": SapoProtocol,
}

# message type -> (handler, the protocol class whose messages it serves)
CLIENT_HANDLERS: dict[str, tuple[ClientHandler, type[ServerProtocol]]] = {
    **{t: (h, FedAvgProtocol) for t, h in FEDAVG_HANDLERS.items()},
    **{t: (h, PubSwapProtocol) for t, h in PUBSWAP_HANDLERS.items()},
    **{t: (h, SapoProtocol) for t, h in SAPO_HANDLERS.items()},
}


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
