"""The catalog of protocols: every `strategy.mode` declared once, with neither torch nor Flower imported.

A protocol family declares itself with `register(Protocol(...))` at the end of this file:
- `modes`: each `strategy.mode` it runs, with the dotted path of its server class (a `base.ServerProtocol`);
- `handlers`: each client message type it sends (`train.<action>` or `query.<action>`, Flower's only forms), with
  the dotted path of the client handler serving it (`handler(work: node_runtime.serving.ClientWork) -> RecordDict`);
- `section`: its own run-config section, a frozen dataclass of `opt` fields (keys `<section>.<key>`), if any;
- `node_state`: the dotted path of the msgspec Struct its nodes keep between messages (node.json's `mode`, read
  through `Learner.family_state`), if any;
- `validate(cfg)`: its cross-key checks, run for a config of one of its modes (ConfigError naming the keys);
- `averages_adapters`: False for a protocol whose server keeps no global adapter (sapo): the strategy keys acting on
  adapters must then stay at their defaults (checked here for every such protocol);
- `smoke_runs`: name -> {"config": flat overrides naming the run's strategy.mode, "flow": the message types one
  round sends, in order, each to every node}: a 2-round in-process run of 3 nodes (tests/protocols/test_rounds.py)
  and the modes the property tests serve (test_properties.py, test_attack_properties.py);
- `golden_runs`: name -> {"config": flat overrides naming its strategy.mode, "nodes": how many}: the runs whose
  metrics tests/golden/<name>.json records (over tests/golden/runs.py's COMMON settings; tests/unit/test_golden.py
  repeats them). A server optimizer declares its golden runs in its class (algorithms/server_optimizers).
Both are plain dicts and tuples, checked here for form (a run's mode one of the family's, a flow of its own message
types); tests/unit/test_catalog.py checks each mode has them.
Dotted paths (`module:name`, a module relative to protocols/ when it starts with '.') are imported when first
used, so importing the catalog (the config does, and so does the ClientApp's routing in a deployed node's
per-message process) loads neither torch nor Flower (an import contract in pyproject.toml, `lint-imports`).
Everything else derives from it: config.MODES and the protocol sections of ExperimentConfig, the ClientApp's routing
(node/app.py, protocols.register_client_handlers), the choices `pubswap keys` lists, and the tests' lists of modes,
runs and flows (test_rounds, test_properties, test_attack_properties, tests/golden/runs.py, test_catalog).

To add a mode, touch these files:
1. protocols/<mode>.py like fedavg.py (the smallest): its messages, server class and client handlers;
2. this file: its `register(Protocol(...))` with modes, handlers, section, node_state and validate if any,
   smoke_runs (with flows covering every message type) and golden_runs;
3. tests/golden/<run>.json for each golden run, recorded with `python -m tests.golden.runs write <run>`;
4. docs/protocols.md: its row in "Messages per round", naming its message types;
5. its own tests of what the shared ones do not cover (e.g. tests/protocols/test_<mode>.py);
and, for a new family whose server keeps state, that state in tests/protocols/test_attack_properties.py
(PROTOCOL), and for one whose server drops a reply of the client report alone, its fake reply in
tests/protocols/fake_clients.py; for a mode with its own section, its keys with their defaults in pyproject.toml's
[tool.flwr.app.config] (tests/unit/test_config.py fails without them).
tests/unit/test_catalog.py fails, naming the mode, when any of 2-4 is missing. A mode sending another family's
messages (FedProx is FedAvg with mu) is one more entry in that family's `modes` (and its smoke and golden runs). A
server optimizer (fedavgm, fedadam) is not a mode: it is a module in algorithms/server_optimizers/, which registers
itself and declares its golden run there.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .keys import MAX_COMPLETIONS_PER_BATCH, ConfigError, between, fraction, one_of, opt

if TYPE_CHECKING:
    from . import ExperimentConfig

MESSAGE_TYPE = re.compile(r"(train|query)\.[A-Za-z_][A-Za-z0-9_]*")  # evaluate.* is Flower's, unused here
MODE_NAME = re.compile(r"[a-z][a-z0-9_-]*")


@dataclass(frozen=True)
class Protocol:
    """One protocol family's declaration (see the module docstring)."""

    family: str
    modes: Mapping[str, str]  # strategy.mode -> dotted path of its ServerProtocol class
    handlers: Mapping[str, str]  # client message type -> dotted path of its handler
    section: tuple[str, type] | None = None  # (section name, its dataclass)
    node_state: str | None = None  # dotted path of the Struct its nodes keep in node.json's "mode"
    validate: Callable[["ExperimentConfig"], None] | None = None
    averages_adapters: bool = True
    # run name -> {"config": flat overrides with its strategy.mode, "flow": the message types a round sends}
    smoke_runs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # run name -> {"config": flat overrides with its strategy.mode, "nodes": how many}
    golden_runs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


CATALOG: dict[str, Protocol] = {}  # strategy.mode -> its family's declaration, in registration order


def register(protocol: Protocol) -> Protocol:
    """Add `protocol` to the catalog; a malformed or clashing declaration is a ValueError at import."""
    if not protocol.modes:
        raise ValueError(f"protocol {protocol.family!r} declares no mode")
    served = message_types()
    for mode, path in protocol.modes.items():
        if not MODE_NAME.fullmatch(mode) or mode in CATALOG:
            raise ValueError(f"protocol {protocol.family!r}: mode {mode!r} is malformed or already declared")
        _check_path(path)
    if protocol.node_state is not None:
        _check_path(protocol.node_state)
    for message_type, path in protocol.handlers.items():
        if not MESSAGE_TYPE.fullmatch(message_type) or message_type in served:
            raise ValueError(f"protocol {protocol.family!r}: message type {message_type!r} is not train.<action> or "
                             "query.<action>, or another protocol already sends it")
        _check_path(path)
    if protocol.section is not None and protocol.section[0] in sections():
        raise ValueError(f"protocol {protocol.family!r}: section {protocol.section[0]!r} is already declared")
    _check_runs(protocol, "smoke", protocol.smoke_runs, smoke_runs(), ("config", "flow"))
    _check_runs(protocol, "golden", protocol.golden_runs, golden_runs(), ("config", "nodes"))
    for mode in protocol.modes:
        CATALOG[mode] = protocol
    return protocol


def _check_path(path: str) -> None:
    module, sep, name = path.partition(":")
    if not (module and sep and name.isidentifier()):
        raise ValueError(f"{path!r} is not a dotted path 'module:name'")


def _check_runs(protocol: Protocol, kind: str, runs: Mapping[str, Mapping[str, Any]], declared: Mapping[str, Any],
                fields: tuple[str, str]) -> None:
    for name, run in runs.items():
        where = f"protocol {protocol.family!r}: {kind} run {name!r}"
        if not MODE_NAME.fullmatch(name) or name in declared:
            raise ValueError(f"{where} is malformed or already declared")
        if not isinstance(run, Mapping) or sorted(run) != sorted(fields):
            raise ValueError(f"{where} must be a mapping of exactly {' and '.join(fields)}")
        if run["config"].get("strategy.mode") not in protocol.modes:
            raise ValueError(f"{where}: its config's strategy.mode must be one of {sorted(protocol.modes)}")
        if kind == "smoke":
            flow = run["flow"]
            if not isinstance(flow, tuple) or not flow or not set(flow) <= set(protocol.handlers):
                raise ValueError(f"{where}: its flow must be a non-empty tuple of {sorted(protocol.handlers)}")
        elif not isinstance(run["nodes"], int) or run["nodes"] < 1:
            raise ValueError(f"{where}: nodes must be a positive int")


PROTOCOLS_PACKAGE = "pubswap_flwr.protocols"  # where a dotted path starting with '.' is


def load(path: str) -> Any:
    """The object a dotted path names (its module imported now; `.fedavg` is protocols/fedavg.py)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module, PROTOCOLS_PACKAGE), name)


# -- what derives from the catalog ---------------------------------------------------------------------------------
def families() -> list[Protocol]:
    return list({id(p): p for p in CATALOG.values()}.values())


def modes() -> tuple[str, ...]:
    return tuple(CATALOG)


def averaging_modes() -> tuple[str, ...]:
    """The modes whose server keeps a global adapter (the help texts and errors of the keys that act on it)."""
    return tuple(mode for mode, p in CATALOG.items() if p.averages_adapters)


def protocol(mode: str) -> Protocol:
    try:
        return CATALOG[mode]
    except KeyError:
        raise ValueError(f"unknown strategy.mode {mode!r}; expected one of {sorted(CATALOG)}") from None


def message_types() -> tuple[str, ...]:
    """Every client message type, in declaration order (what the ClientApp routes)."""
    return tuple(t for p in families() for t in p.handlers)


def owner(message_type: str) -> Protocol:
    """The family whose messages these are (its modes may receive them)."""
    for p in families():
        if message_type in p.handlers:
            return p
    raise ValueError(f"no protocol sends message type {message_type!r}")


def smoke_runs() -> dict[str, Mapping[str, Any]]:
    """Every family's smoke runs, name -> {"config", "flow"}, in declaration order (tests/protocols run them)."""
    return {name: run for p in families() for name, run in p.smoke_runs.items()}


def golden_runs() -> dict[str, Mapping[str, Any]]:
    """Every family's golden runs, name -> {"config", "nodes"}, in declaration order (tests/golden/runs.py adds
    the server optimizers' own)."""
    return {name: run for p in families() for name, run in p.golden_runs.items()}


def sections() -> dict[str, type]:
    """The protocols' own config sections, name -> dataclass, in declaration order."""
    return dict(p.section for p in families() if p.section is not None)


def validate(cfg: "ExperimentConfig") -> None:
    """The checks of the run's protocol (ExperimentConfig.validate calls this)."""
    declared = protocol(cfg.strategy.mode)
    if not declared.averages_adapters:
        _adapter_keys_unused(cfg)
    if declared.validate is not None:
        declared.validate(cfg)


def _adapter_keys_unused(cfg: "ExperimentConfig") -> None:
    s, mode = cfg.strategy, cfg.strategy.mode
    if s.compression != "none":
        raise ConfigError(f"strategy.compression = {s.compression!r} compresses adapters; {mode} mode sends none, so "
                          "leave it at 'none'")
    if s.aggregation != type(s)().aggregation:
        raise ConfigError(f"strategy.aggregation applies to adapter averaging; {mode} mode averages nothing")
    if s.server_optimizer != "none":
        raise ConfigError(f"strategy.server-optimizer = {s.server_optimizer!r} moves the global adapter; {mode} mode "
                          "keeps none, so leave it at 'none'")


# -- the protocols -------------------------------------------------------------------------------------------------
# Each family's smoke runs (2-round in-process runs of 3 nodes, tests/protocols) and golden runs (tests/golden, over
# the common settings in tests/golden/runs.py) are config overrides; a smoke run's flow is the message types one
# round sends, in order, each to every node.
register(Protocol("fedavg", modes={"fedavg": ".fedavg:FedAvgProtocol", "fedprox": ".fedavg:FedProxProtocol"},
                  handlers={"train.local_round": ".fedavg:local_round"},
                  smoke_runs={"fedavg": {"config": {"strategy.mode": "fedavg"}, "flow": ("train.local_round",)},
                              "fedprox": {"config": {"strategy.mode": "fedprox"}, "flow": ("train.local_round",)}},
                  golden_runs={"fedavg": {"config": {"strategy.mode": "fedavg"}, "nodes": 3},
                               "fedprox": {"config": {"strategy.mode": "fedprox", "strategy.proximal-mu": 0.05},
                                           "nodes": 3}}))


@dataclass(frozen=True)
class PubSwapConfig:
    swap: str = opt("balanced", one_of("balanced", "random", "none"),
                    "balanced or random (the paper's rules); none: public steps on the client's own responses only (an "
                    "ablation)")
    tau_swap: int = opt(5, between(1, 10_000), "every tau_swap-th local step is a public step")
    public_prompts: int = opt(4, between(1, 4096), "public prompts per public step")
    public_size: int = opt(200, between(1, 100_000), "items in the public set (generated at start)")
    public_mix: str = opt("", doc="task mix of the public set (empty = tasks.mix)")
    correct_threshold: float = opt(1.0, fraction, "a response is correct when its reward >= this")
    base: str = opt("fedavg", one_of("fedavg", "fedprox"))
    donor: str = opt("uniform", one_of("uniform", "likely"),
                     "Balanced's donor choice: uniform at random (the paper), or likely: the server sends up to "
                     "donor-candidates correct responses and the receiving client keeps those its current policy finds "
                     "most likely (mean token log-prob)")
    donor_candidates: int = opt(8, between(1, 64), "donor = likely: candidates sent per (client, prompt)")
    schedule: str = opt("fixed", one_of("fixed", "adaptive"),
                        "fixed: a public step every tau-swap steps; adaptive: the number of public steps per round "
                        "follows the last round's policy disagreement between clients (min/max-public-steps, "
                        "disagreement-low/high); round 1 uses tau / tau-swap")
    min_public_steps: int = opt(1, between(1, 10_000), "schedule = adaptive: public steps at disagreement-low or below")
    max_public_steps: int = opt(8, between(1, 10_000), "schedule = adaptive: the budget, public steps at "
                                                       "disagreement-high or above")
    disagreement_low: float = opt(0.2, between(0, 1), "schedule = adaptive: disagreement at or below which the fewest "
                                                      "public steps run")
    disagreement_high: float = opt(0.6, between(0, 1), "schedule = adaptive: disagreement at or above which the "
                                                       "budget runs")
    measure_uptake: bool = opt(False, doc="each public step also measures, on the receiving client, the mean "
                                          "per-token log-prob of the donors' responses and of its own kept ones, "
                                          "before and after its update (two extra forward passes; metrics row: "
                                          "clients' uptake_*)")


def check_pubswap(cfg: "ExperimentConfig") -> None:
    p, t = cfg.pubswap, cfg.train
    if p.tau_swap > t.local_steps:
        raise ConfigError(f"pubswap.tau-swap = {p.tau_swap} exceeds train.local-steps = {t.local_steps}: no public "
                          "step would run")
    if p.donor == "likely" and p.swap != "balanced":
        raise ConfigError(f"pubswap.donor = 'likely' chooses among Balanced's donors; pubswap.swap is {p.swap!r}")
    if p.schedule == "adaptive":
        if p.min_public_steps > p.max_public_steps:
            raise ConfigError(f"pubswap.min-public-steps = {p.min_public_steps} exceeds pubswap.max-public-steps = "
                              f"{p.max_public_steps}")
        if p.max_public_steps > t.local_steps:
            raise ConfigError(f"pubswap.max-public-steps = {p.max_public_steps} exceeds train.local-steps = "
                              f"{t.local_steps}")
        if p.disagreement_low >= p.disagreement_high:
            raise ConfigError(f"pubswap.disagreement-low = {p.disagreement_low} must be below "
                              f"pubswap.disagreement-high = {p.disagreement_high}")
    if p.public_prompts * t.completions_per_prompt > MAX_COMPLETIONS_PER_BATCH:
        raise ConfigError(f"pubswap.public-prompts x train.completions-per-prompt = {p.public_prompts} x "
                          f"{t.completions_per_prompt}: more than {MAX_COMPLETIONS_PER_BATCH} completions per public "
                          "step")


_PUBSWAP_GOLDEN = {"strategy.mode": "pubswap", "pubswap.tau-swap": 1, "pubswap.public-prompts": 2}
register(Protocol("pubswap", modes={"pubswap": ".pubswap:PubSwapProtocol"},
                  handlers={"train.segment": ".pubswap:segment"}, section=("pubswap", PubSwapConfig),
                  node_state=".pubswap_messages:PubSwapNodeState", validate=check_pubswap,
                  # tau = 2, tau_swap = 1: public steps 1 and 2, so 3 segments
                  smoke_runs={"pubswap": {"config": {"strategy.mode": "pubswap", "train.local-steps": 2,
                                                     "pubswap.tau-swap": 1, "pubswap.public-prompts": 2},
                                          "flow": ("train.segment",) * 3}},
                  golden_runs={"pubswap-balanced": {"config": {**_PUBSWAP_GOLDEN, "pubswap.swap": "balanced"},
                                                    "nodes": 3},
                               "pubswap-random": {"config": {**_PUBSWAP_GOLDEN, "pubswap.swap": "random",
                                                             "pubswap.base": "fedprox"}, "nodes": 3},
                               "pubswap-none": {"config": {**_PUBSWAP_GOLDEN, "pubswap.swap": "none"}, "nodes": 3}}))


@dataclass(frozen=True)
class SapoConfig:
    local: int = opt(4, between(0, 256, why="a reply carries at most 256 packets"),
                     "I: local rollout groups trained per round")
    external: int = opt(4, between(0, 4096), "J: external rollout groups trained per round")
    sharing: str = opt("local", one_of("local", "fixed"),
                       "local: a node samples B = I questions per round and shares those I groups; fixed: it samples "
                       "sapo.questions and shares sapo.share of them whatever I is (the SAPO paper reads either "
                       "way: docs/protocols.md)")
    questions: int = opt(8, between(1, 4096), "B with sapo.sharing = fixed: questions sampled per node per round")
    completions: int = opt(8, between(2, 1024), "L: completions per question")
    share: int = opt(8, between(0, 256, why="a reply carries at most 256 packets"),
                     "with sapo.sharing = fixed: groups each node shares per round")
    async_mode: bool = opt(False, doc="one message per round, training on the previous round's pool", key="async")
    verify_provenance: bool = opt(True, doc="regenerate reasoning-gym packets from their provenance and drop "
                                            "forged ones (off: such packets cannot be verified, see "
                                            "accept-unverifiable)")
    accept_unverifiable: bool = opt(False, doc="also train on peer items the receiver cannot verify itself, scored "
                                               "against the sender's answer (off: only reasoning-gym items regenerated "
                                               "from provenance, and items of the receiver's own data file with the "
                                               "same question, scored against its own answer; others are dropped)")
    reputation: bool = opt(False, doc="order the draw of external groups by each sender's verification record (no "
                                      "sender gets more than its fair share of J either way)")
    share_informative_only: bool = opt(False, doc="share only groups whose rewards differ under the sender's own "
                                                  "scoring (at most as many as sharing allows); receivers still "
                                                  "re-score and filter every packet")


def check_sapo(cfg: "ExperimentConfig") -> None:
    for key, value in (("train.dynamic-sampling", cfg.train.dynamic_sampling),
                       ("train.skip-equal-prompts", cfg.train.skip_equal_prompts)):
        if value:
            raise ConfigError(f"{key} = {value}: a node's private steps only; strategy.mode = 'sapo' has none (its "
                              "nodes sample their groups in its rollout phase)")
    s = cfg.sapo
    if s.local + s.external == 0:
        raise ConfigError("sapo.local + sapo.external must be >= 1")
    if s.sharing == "fixed" and s.local > s.questions:
        raise ConfigError(f"sapo.local = {s.local} exceeds sapo.questions = {s.questions}")
    if s.sharing == "fixed" and s.share > s.questions:
        raise ConfigError(f"sapo.share = {s.share} exceeds sapo.questions = {s.questions}")
    questions, name = (s.local, "sapo.local") if s.sharing == "local" else (s.questions, "sapo.questions")
    if questions * s.completions > MAX_COMPLETIONS_PER_BATCH:
        raise ConfigError(f"{name} x sapo.completions = {questions} x {s.completions}: more than "
                          f"{MAX_COMPLETIONS_PER_BATCH} completions per round")


_SAPO_SMOKE = {"strategy.mode": "sapo", "sapo.questions": 3, "sapo.completions": 4, "sapo.local": 2,
               "sapo.external": 2, "sapo.share": 3}
_SAPO_GOLDEN = {**_SAPO_SMOKE, "sapo.sharing": "fixed"}  # the behaviour these runs were recorded with (before #13)
register(Protocol("sapo", modes={"sapo": ".sapo:SapoProtocol"},
                  handlers={"query.rollouts": ".sapo:collect_rollouts", "train.sapo": ".sapo:sapo_train",
                            "train.sapo_async": ".sapo:sapo_async_round"},
                  section=("sapo", SapoConfig), node_state=".sapo:SapoNodeState", validate=check_sapo,
                  averages_adapters=False,
                  smoke_runs={"sapo": {"config": _SAPO_SMOKE, "flow": ("query.rollouts", "train.sapo")},
                              "sapo-async": {"config": {**_SAPO_SMOKE, "sapo.async": True},
                                             "flow": ("train.sapo_async",)}},
                  golden_runs={"sapo-sync": {"config": _SAPO_GOLDEN, "nodes": 3},
                               "sapo-async": {"config": {**_SAPO_GOLDEN, "sapo.async": True, "num-server-rounds": 3},
                                              "nodes": 3},
                               "sapo-two-models": {"config": {**_SAPO_GOLDEN,
                                                              "model.node-models": "embedded:tiny,embedded:tiny-b"},
                                                   "nodes": 4},
                               "sapo-paper-sharing": {"config": {**_SAPO_GOLDEN, "sapo.sharing": "local",
                                                                 "eval.samples": 3}, "nodes": 3}}))
# the baseline of federating at all: nodes train alone, the server keeps and averages no adapter (issue #38 item 6)
register(Protocol("local", modes={"local": ".local:LocalProtocol"}, handlers={"train.alone": ".local:train_alone"},
                  averages_adapters=False,
                  smoke_runs={"local": {"config": {"strategy.mode": "local"}, "flow": ("train.alone",)}},
                  golden_runs={"local": {"config": {"strategy.mode": "local"}, "nodes": 3}}))
