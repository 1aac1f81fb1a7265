"""The catalog of protocols is the one list of modes and message types: config.MODES, `pubswap keys`, the ClientApp's
routing (light and in-process) and every protocol module agree with it, and importing it loads neither torch nor
Flower. Every mode has what the tests derive from its entry (a smoke run with its flow, a golden run and its recorded
file), a row in docs/protocols.md and its place in `pubswap keys`; every server optimizer has its golden run."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli
from pubswap_flwr.algorithms import server_optimizers
from pubswap_flwr.config import MODES, SECTIONS, ExperimentConfig, catalog, key_choices, key_table
from pubswap_flwr.node import app as nodeapp
from pubswap_flwr.protocols import client_handlers, protocol_class, register_client_handlers

PROJECT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = PROJECT / "tests" / "golden"  # tests/golden/runs.py's, not imported: it needs runs this file checks


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
    from pubswap_flwr.protocols.base import ServerProtocol
    from pubswap_flwr.wire.records import Instruction

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
    from pubswap_flwr.wire import records

    for path in _declared_paths():  # every protocol module: their Instruction subclasses
        importlib.import_module(path.partition(":")[0], catalog.PROTOCOLS_PACKAGE)
    sent = {c.message_type for c in _subclasses(records.Instruction)
            if "message_type" in vars(c) and c.__module__.startswith("pubswap_flwr.")}  # not the tests' own
    assert sent == set(catalog.message_types())


def _declared_paths() -> list[str]:
    return [path for p in catalog.families() for path in [*p.modes.values(), *p.handlers.values()]]


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
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={}, node_state=".x.State"), "'.x.State' is not a dotted path"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={}, section=("sapo", object)), "section 'sapo' is already"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"train.x": ".x:f"},
                      smoke_runs={"x": {"config": {"strategy.mode": "x"}}}),
     "smoke run 'x' must be a mapping of exactly config and flow"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"train.x": ".x:f"},
                      smoke_runs={"x": {"config": {"strategy.mode": "fedavg"}, "flow": ("train.x",)}}),
     "smoke run 'x': its config's strategy.mode must be one of ['x']"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={"train.x": ".x:f"},
                      smoke_runs={"x": {"config": {"strategy.mode": "x"}, "flow": ("train.local_round",)}}),
     "smoke run 'x': its flow must be a non-empty tuple of ['train.x']"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={}, smoke_runs={"fedavg": {}}),
     "smoke run 'fedavg' is malformed or already declared"),
    (catalog.Protocol("x", modes={"x": ".x:X"}, handlers={},
                      golden_runs={"x": {"config": {"strategy.mode": "x"}, "nodes": 0}}), "nodes must be a positive"),
])
def test_a_clashing_or_malformed_declaration_is_refused_and_leaves_the_catalog_as_it_was(declaration, problem):
    before = dict(catalog.CATALOG)
    with pytest.raises(ValueError, match=re.escape(problem)):
        catalog.register(declaration)
    assert catalog.CATALOG == before


def test_each_declared_node_state_is_a_struct_a_fresh_node_starts_from():
    import msgspec

    declared = {p.family: p.node_state for p in catalog.families() if p.node_state}
    assert sorted(declared) == ["pubswap", "sapo"]  # fedavg and local nodes keep nothing of their own
    for path in declared.values():
        kind = catalog.load(path)
        assert issubclass(kind, msgspec.Struct)
        assert msgspec.convert({}, kind, strict=True) == kind()  # what an empty node.json "mode" reads as


def test_an_unknown_mode_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown strategy.mode 'fedsgd'; expected one of \['fedavg', 'fedprox'"):
        protocol_class("fedsgd")


def test_importing_the_catalog_and_the_config_loads_neither_torch_nor_flower_nor_a_protocol_module():
    code = ("import sys, pubswap_flwr.config, pubswap_flwr.config.catalog; "
            "print(sorted(m for m in ('torch', 'flwr', 'pubswap_flwr.protocols.base', "
            "'pubswap_flwr.wire.records', 'pubswap_flwr.node_runtime.serving') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT)
    assert done.stdout.strip() == "[]"


# -- what each mode must have: the tests derive their lists from the catalog, so a mode without these goes untested
def _runs_of(mode: str, runs: dict) -> list[str]:
    return [name for name, run in runs.items() if run["config"]["strategy.mode"] == mode]


@pytest.mark.parametrize("mode", catalog.modes())
def test_every_mode_has_a_smoke_run_with_its_flow(mode):
    runs = _runs_of(mode, catalog.smoke_runs())
    assert runs, f"mode {mode!r} has no smoke run: declare one in its catalog entry's smoke_runs"
    for name in runs:
        assert catalog.smoke_runs()[name]["flow"], f"mode {mode!r}: smoke run {name!r} declares no flow"


@pytest.mark.parametrize("family", [p.family for p in catalog.families()])
def test_every_message_type_of_a_family_is_in_a_smoke_runs_flow(family):
    declared = next(p for p in catalog.families() if p.family == family)
    flown = {t for run in declared.smoke_runs.values() for t in run["flow"]}
    missing = [t for t in declared.handlers if t not in flown]
    assert not missing, f"protocol {family!r}: message types {missing} are in no smoke run's flow"


@pytest.mark.parametrize("mode", catalog.modes())
def test_every_mode_has_a_golden_run_and_its_recorded_file(mode):
    runs = _runs_of(mode, catalog.golden_runs())
    assert runs, f"mode {mode!r} has no golden run: declare one in its catalog entry's golden_runs"
    for name in runs:
        assert (GOLDEN_DIR / f"{name}.json").is_file(), \
            f"mode {mode!r}: golden run {name!r} has no file tests/golden/{name}.json (record it: python -m " \
            f"tests.golden.runs write {name})"


@pytest.mark.parametrize("optimizer", [n for n in server_optimizers.names() if n != "none"])
def test_every_server_optimizer_has_a_golden_run_and_its_recorded_file(optimizer):
    runs = [name for name, run in server_optimizers.OPTIMIZERS[optimizer].golden_runs.items()
            if run["config"].get("strategy.server-optimizer") == optimizer]
    assert runs, f"server optimizer {optimizer!r} has no golden run: declare one in its class's golden_runs"
    for name in runs:
        assert (GOLDEN_DIR / f"{name}.json").is_file(), \
            f"server optimizer {optimizer!r}: golden run {name!r} has no file tests/golden/{name}.json"


def test_every_golden_file_is_a_declared_golden_run():
    from tests.golden.runs import DECLARED

    recorded = sorted(path.stem for path in GOLDEN_DIR.glob("*.json"))
    assert not set(recorded) - set(DECLARED), f"golden files no run declares: {sorted(set(recorded) - set(DECLARED))}"
    assert len(DECLARED) == len(catalog.golden_runs()) + len(server_optimizers.golden_runs())  # no name declared twice


def _documented_modes() -> dict[str, str]:
    """Mode -> its row of the table in docs/protocols.md's "Messages per round" (first cell: modes joined by '/',
    a variant in parentheses)."""
    text = (PROJECT / "docs" / "protocols.md").read_text()
    section = text.split("## Messages per round", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first = re.sub(r"\(.*?\)", "", line.split("|")[1])
            for name in first.split("/"):
                rows[name.strip()] = rows.get(name.strip(), "") + line
    return rows


@pytest.mark.parametrize("mode", catalog.modes())
def test_every_mode_has_a_row_in_docs_protocols_naming_its_message_types(mode):
    rows = _documented_modes()
    assert mode in rows, f"mode {mode!r} has no row in docs/protocols.md's table 'Messages per round'"
    flows = {t for name in _runs_of(mode, catalog.smoke_runs()) for t in catalog.smoke_runs()[name]["flow"]}
    missing = sorted(t for t in flows if f"`{t}`" not in rows[mode])
    assert not missing, f"mode {mode!r}: its rows in docs/protocols.md do not name message types {missing}"


@pytest.mark.parametrize("mode", catalog.modes())
def test_every_mode_and_its_section_are_listed_by_pubswap_keys(mode, capsys):
    assert cli.main(["keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(line for line in lines if line.split()[0] == "strategy.mode")
    choices = re.search(r"\(one of: ([^)]*)\)", line).group(1).split(" | ")
    assert mode in choices, f"mode {mode!r} is not among strategy.mode's choices in `pubswap keys`: {line}"
    section = catalog.protocol(mode).section
    if section is not None:
        listed = {line.split()[0] for line in lines if line.startswith(f"{section[0]}.")}
        assert listed == {key for key in key_table() if key.startswith(f"{section[0]}.")} != set(), \
            f"mode {mode!r}: `pubswap keys` does not list its section {section[0]!r}"


# -- mode lists derive from the catalog --------------------------------------------------------------------------------
def _literal_mode_lists(source: str, modes: set[str]) -> list[str]:
    """Where the code (docstrings and messages aside) names modes by hand: a comparison of a `mode` with a mode's
    name, or a tuple, list or set literal holding two or more of them."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named_mode = any(isinstance(s, ast.Attribute) and s.attr == "mode" or isinstance(s, ast.Name)
                             and s.id == "mode" for s in sides)
            if named_mode and any(isinstance(s, ast.Constant) and s.value in modes for s in sides):
                found.append(f"line {node.lineno}: a mode compared with a literal")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in modes]
            if len(names) >= 2:
                found.append(f"line {node.lineno}: modes {names} listed by hand")
    return found


def test_no_module_of_the_package_lists_modes_by_hand_outside_the_catalog():
    from pathlib import Path

    modes = set(catalog.modes())
    package = Path(catalog.__file__).resolve().parents[1]
    found = {str(path.relative_to(package)): hits for path in sorted(package.rglob("*.py"))
             if path.name != "catalog.py" and (hits := _literal_mode_lists(path.read_text(), modes))}
    assert found == {}, f"modes named by hand, not derived from config/catalog.py: {found}"
    # the check sees both forms
    assert _literal_mode_lists('if cfg.strategy.mode == "sapo": pass\nx = ("fedavg", "pubswap")\n', modes) == [
        "line 1: a mode compared with a literal", "line 2: modes ['fedavg', 'pubswap'] listed by hand"]
