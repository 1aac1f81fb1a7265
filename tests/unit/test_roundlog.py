"""RoundLog: a client whose own samples lose the answer format is warned about, with its numbers."""

from __future__ import annotations

import logging

from pubswap_flwr.rounds.roundlog import RoundLog
from pubswap_flwr.wire.counters import FormatCounts


def test_a_client_below_the_well_formed_threshold_is_warned_about(caplog):
    round_log = RoundLog(7)
    round_log.client(11)["node_index"] = 0
    round_log.client(12)["node_index"] = 1
    round_log.client(13)["node_index"] = 2
    round_log.formats = {11: FormatCounts(64, 64), 12: FormatCounts(64, 40), 13: FormatCounts(64, 10)}
    round_log.dropped[13] = "timed out"  # a dropped client is reported by its drop, not here
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        assert round_log.warn_broken_formats() == [12]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "round 7: client 12 (node index 1) kept the <answer>...</answer> format in only 40 of its 64" in messages[0]
    assert round_log.warn_broken_formats(threshold=0.5) == []
