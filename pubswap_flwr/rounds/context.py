"""What a protocol's server round works with: its number, the exchange that reaches the nodes and the round's log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..wire.records import Header

if TYPE_CHECKING:  # a node loads the protocols' modules, this one with them, but never the exchange's code
    from .exchange import Exchange
    from .roundlog import RoundLog


@dataclass
class RoundContext:
    """What a protocol's server round works with."""

    number: int
    final: bool
    evaluate: bool  # SAPO: nodes evaluate their own models this round
    exchange: Exchange
    log: RoundLog
    run_name: str
    run_dir: str

    def header(self, round_start: bool = False, proximal_mu: float = 0.0) -> Header:
        return Header(self.number, self.run_name, self.run_dir, round_start, proximal_mu=proximal_mu)
