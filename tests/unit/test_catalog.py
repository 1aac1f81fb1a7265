"""The catalog of protocols is the one list of modes and message types: config.MODES, `pubswap keys`, the ClientApp's
routing (light and in-process) and every protocol module agree with it, and importing it loads neither torch nor
Flower."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli, nodeapp
from pubswap_flwr.config import MODES, SECTIONS, ExperimentConfig, key_choices, key_table
from pubswap_flwr.protocols import catalog, client_handlers, protocol_class, register_client_handlers

PROJECT = Path(__file__).resolve().parents[2]


def _routed(app) -> list[str]:
    return sorted(app._registered_funcs)  # Flower's ClientApp keeps its routing table there (flwr 1.42)


def test_the_catalog_pubswap_keys_and_the_client_app_routing_agree(capsys):
    from flwr.clientapp import ClientApp

    import client_app

    modes = catalog.modes()
    assert modes == MODES == key_choices()["strategy.mode"]
    assert cli.main(["keys"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.split()[0] == "strategy.mode")
    assert f"(one of: {' | '.join(modes)})" in line
    types = sorted(catalog.message_types())
    assert _routed(client_app.app) == _routed(nodeapp.build_client_app()) == sorted(nodeapp.MESSAGE_TYPES) == types
    assert _routed(register_client_handlers(ClientApp())) == types == sorted(client_handlers())


def test_every_declared_path_names_a_server_class_or_a_handler_of_that_protocol():
    from pubswap_flwr.protocols.base import Instruction, ServerProtocol

    for protocol in catalog.families():
        for mode in protocol.modes:
            server = protocol_class(mode)
            assert issubclass(server, ServerProtocol)
            assert server.holds_global_adapter == protocol.averages_adapters, mode
        for message_type, path in protocol.handlers.items():
            handler = catalog.load(path)
            assert callable(handler) and list(inspect.signature(handler).parameters) == ["work"]
            module = sys.modules[handler.__module__]
            sent = {c.message_type for c in vars(module).values()
                    if inspect.isclass(c) and issubclass(c, Instruction) and hasattr(c, "message_type")}
            assert message_type in sent, f"{path}: no instruction of {module.__name__} has type {message_type}"


def test_every_instruction_type_is_routed():
    from pubswap_flwr.protocols import base, fedavg, pubswap, sapo  # noqa: F401 - their Instruction subclasses

    sent = {c.message_type for c in _subclasses(base.Instruction) if "message_type" in vars(c)}
    assert sent == set(catalog.message_types())


def _subclasses(cls: type) -> list[type]:
    return [sub for direct in cls.__subclasses__() for sub in [direct, *_subclasses(direct)]]


def test_a_protocols_section_is_a_config_section_with_its_keys():
    for name, section in catalog.sections().items():
        assert SECTIONS[name] is section
        assert isinstance(getattr(ExperimentConfig(), name), section)
        assert any(key.startswith(f"{name}.") for key in key_table())
    assert list(SECTIONS).index("pubswap") == list(SECTIONS).index("strategy") + 1  # after strategy, in `keys` too


@pytest.mark.parametrize("declaration, problem", [
    (catalog.Protocol("x", modes={"fedavg": ".x:X"}, handlers={}), "mode 'fedavg' is malformed or already declared"),
    (catalog.Protocol("x", modes={"New": ".x:X"}, handlers={}), "mode 'New' is malformed"),
    (catalog.Protocol("x", modes={}, handlers={}), "declares no mode"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"train.segment": ".x:f"}), "another protocol already sends"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"generate": ".x:f"}), "is not train.<action>"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"query.gen-x": ".x:f"}), "is not train.<action>"),
    (catalog.Protocol("x", modes={"x": "x.X"}, handlers={}), "is not a dotted path"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={}, section=("sapo", object)), "section 'sapo' is already"),
])
def test_a_clashing_or_malformed_declaration_is_refused_and_leaves_the_catalog_as_it_was(declaration, problem):
    before = dict(catalog.CATALOG)
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(".", r"\.")):
        catalog.register(declaration)
    assert catalog.CATALOG == before


def test_an_unknown_mode_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown strategy.mode 'fedsgd'; expected one of \['fedavg', 'fedprox'"):
        protocol_class("fedsgd")


def test_importing_the_catalog_and_the_config_loads_neither_torch_nor_flower_nor_a_protocol_module():
    code = ("import sys, pubswap_flwr.config, pubswap_flwr.protocols.catalog; "
            "print(sorted(m for m in ('torch', 'flwr', 'pubswap_flwr.protocols.base') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT)
    assert done.stdout.strip() == "[]"
