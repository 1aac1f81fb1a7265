"""The bases state their contracts (issue #57 items 3 and 5): a mode's server class without `run_round`, a message
type without its `message_type`, and a server optimizer without `step` cannot be made, and the error names what is
missing; a message type's config keys are declared once, as its `config`, and its record codec derives from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from pubswap_flwr.algorithms.server_optimizers import ServerOptimizer
from pubswap_flwr.protocols.base import ServerProtocol
from pubswap_flwr.schema import Count
from pubswap_flwr.wire.codecs import CONFIG_KEY
from pubswap_flwr.wire.records import Header, Instruction, InstructionConfig


def test_a_server_protocol_without_run_round_cannot_be_made():
    class Incomplete(ServerProtocol):
        pass

    with pytest.raises(TypeError, match="run_round"):
        Incomplete(settings=None)


def test_a_message_type_without_its_message_type_cannot_be_declared():
    with pytest.raises(TypeError, match="Nameless: an instruction must name its message_type"):
        @dataclass(frozen=True)
        class Nameless(Instruction):
            pass


class CountConfig(InstructionConfig, frozen=True, kw_only=True):
    steps: Count
    fast_mode: bool = False


@dataclass(frozen=True)
class CountSteps(Instruction):
    message_type: ClassVar[str] = "train.count_steps"
    config: CountConfig


def test_a_message_types_record_codec_derives_from_its_declared_config():
    message = CountSteps(Header(3, "run"), CountConfig(steps=4, fast_mode=True))
    record = message.to_record()
    assert dict(record[CONFIG_KEY]) == {"server-round": 3, "run-name": "run", "run-dir": "", "round-start": False,
                                        "steps": 4, "fast-mode": True}  # its keys in kebab-case beside the header's
    assert CountSteps.from_record(record) == message
    record[CONFIG_KEY]["steps"] = -2
    with pytest.raises(ValueError, match=r"instruction config.steps: expected `int` >= 0"):
        CountSteps.from_record(record)


def test_a_server_optimizer_without_step_cannot_be_made():
    class Still(ServerOptimizer):
        name = "still"

    with pytest.raises(TypeError, match="step"):
        Still(settings=None)
