"""Issue #34's attack classes, one test each: SAPO items a receiver cannot verify (a forged answer under a
non-reasoning-gym verifier), a packet flood from one sender (at the relay and in the receiver's draw of J), and
direction attacks on the default aggregation (sign flip, fixed-direction pusher, zero-update sybils, rounds of too
few replies); then property tests over any verifier and answer, any packet counts per sender and any direction of a
minority's updates. Aggregation runs the server's own path (fedavg.aggregate_adapters) on modelled updates: numpy
vectors, each honest step the true direction d (norm 1) plus noise of norm ~1, the global following 20 rounds."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubswap_flwr.algorithms.sapo_selection import Packet, select_external
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.protocols.fedavg import aggregate_adapters
from pubswap_flwr.protocols.sapo import SapoNode
from pubswap_flwr.protocols.sapo_messages import SapoTrain
from pubswap_flwr.rounds.roundlog import RoundLog
from pubswap_flwr.tasks import MixtureStream, StreamCursor, TaskItem, score_completion
from pubswap_flwr.wire.codecs import PAYLOAD_KEY, payload_from_record, payload_record
from tests.protocols.fake_clients import serve_rounds

QUICK = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
MIX = "basic_arithmetic:1,gcd:1"
OWN_ROWS = [{"question": "What is 4 + 7?", "answer": "11"},
            {"question": "What is half of 3?", "answer": "1.5", "verifier": "numeric"},
            {"question": "Spell 'cat' backward.", "answer": "tac"}]


def _node(tmp_path, name: str, flat: dict | None = None, rows: list | None = None) -> SapoNode:
    cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "tasks.mix": MIX, "tasks.per-node": 0,
                                      "eval.items-per-task": 3, "sapo.completions": 4, **(flat or {})})
    data = None
    if rows is not None:
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data_path = None if data is None else str(data)
    identity = NodeIdentity(0, tmp_path / name, "embedded:tiny", data_path=data_path)
    return SapoNode(Learner(NodeSettings.of(cfg), identity), cfg.sapo)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    return _node(tmp_path_factory.mktemp("receiver"), "rg")


@pytest.fixture(scope="module")
def holder(tmp_path_factory):
    """A receiver whose own training data is an organization file (exact and numeric verifiers)."""
    return _node(tmp_path_factory.mktemp("holder"), "org", rows=OWN_ROWS)


def _own_task_item(node: SapoNode, task: str) -> TaskItem:
    universe = node.learner.universe
    spec = next(t for t in universe.tasks if t.name == task)
    return MixtureStream([spec], universe.tasks, node=5, exclude=set()).take(1, StreamCursor())[0]


def tagged(*answers: str) -> tuple[str, ...]:
    return tuple(f"<answer>{a}</answer>" for a in answers)


# -- 1. SAPO items the receiver cannot verify -----------------------------------------------------------------------
def test_1_a_forged_answer_under_a_non_reasoning_gym_verifier_is_never_trained_on(receiver):
    item = _own_task_item(receiver, "basic_arithmetic")  # the receiver's own task, its question
    wrong = str(int(item.answer) + 1)
    forged = TaskItem("liar/1", item.task, item.question, wrong, "exact")
    pool = [Packet("liar", forged, tagged(wrong, item.answer))]
    with pytest.raises(ValueError, match="cannot verify"):
        receiver.rescore(pool[0])
    selection = select_external(pool, 4, lambda p: receiver.rescore(p), random.Random(0))
    assert selection.chosen == [] and selection.rejected == 1 and selection.unverifiable == 1
    assert "liar/liar/1: cannot verify" in selection.rejections[0]


def test_1_a_holder_scores_a_peer_copy_of_its_own_item_against_its_own_answer(holder):
    own = TaskItem("peer/3", "org", "What is 4 + 7?", "11", "exact")
    assert holder.rescore(Packet("peer", own, tagged("12", "11", "eleven"))) == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="does not match this node's own answer"):
        holder.rescore(Packet("peer", replace(own, answer="12"), tagged("12", "11")))
    with pytest.raises(ValueError, match="does not match this node's own answer"):  # another verifier is no way out
        holder.rescore(Packet("peer", replace(own, answer="12", verifier="numeric"), tagged("12", "11")))
    half = TaskItem("peer/4", "org", "What is half of 3?", "1.5", "numeric")
    assert holder.rescore(Packet("peer", half, tagged("1.50", "2"))) == [1.0, 0.0]
    with pytest.raises(ValueError, match="cannot verify"):
        holder.rescore(Packet("peer", TaskItem("peer/5", "org", "What is 9 + 9?", "18", "exact"), tagged("18", "1")))


def test_1_unverifiable_items_are_scored_as_sent_only_under_sapo_accept_unverifiable(tmp_path):
    trusting = _node(tmp_path, "trusting", {"sapo.accept-unverifiable": True})
    assert ExperimentConfig().sapo.accept_unverifiable is False
    item = _own_task_item(trusting, "basic_arithmetic")
    forged = TaskItem("liar/1", item.task, item.question, "12", "exact")
    assert trusting.rescore(Packet("liar", forged, tagged("12", item.answer))) == [1.0, 0.0]


# -- 2. one sender floods the pool ----------------------------------------------------------------------------------
def exact(p: Packet) -> list[float]:
    return [1.0 if c == tagged(p.item.answer)[0] else 0.0 for c in p.completions]


def _packets(sender: str, count: int) -> list[Packet]:
    return [Packet(sender, TaskItem(f"{sender}/{i}", "t", f"q {sender} {i}", "4", "exact"), tagged("4", "5"))
            for i in range(count)]


@pytest.mark.parametrize("seed", range(5))
def test_2_one_sender_flooding_the_pool_gets_no_more_than_its_fair_share_of_j(seed):
    pool = _packets("flood", 64) + _packets("a", 4) + _packets("b", 4) + _packets("c", 4)
    random.Random(seed).shuffle(pool)
    chosen = Counter(s.packet.sender for s in select_external(pool, 8, exact, random.Random(seed)).chosen)
    assert chosen == {"flood": 2, "a": 2, "b": 2, "c": 2}


def test_2_the_relay_passes_on_no_more_packets_per_sender_than_a_node_shares():
    relayed: dict[int, Counter] = {}

    def flood(node, message, content):
        kind = message.metadata.message_type
        if kind == "train.sapo":
            relayed[node] = Counter(p.sender for p in SapoTrain.from_record(message.content).pool)
        if node == 101 and kind == "query.rollouts":
            payload = payload_from_record(content[PAYLOAD_KEY])
            payload["packets"] = [payload["packets"][0]] * 64
            content[PAYLOAD_KEY] = payload_record(payload)
        return content

    rows, _ = serve_rounds({"strategy.mode": "sapo", "sapo.local": 4, "sapo.completions": 2}, flood, nodes=4,
                           rounds=1)
    assert set(relayed) == {101, 102, 103, 104}
    for node in (102, 103, 104):
        assert relayed[node]["00000-101"] == 4  # sapo.local: what the config asks a node to share
    assert rows[1]["clients"]["101"]["packets_over_cap"] == 60


# -- 3. direction attacks on the default aggregation ----------------------------------------------------------------
DIM, ROUNDS, NOISE = 64, 20, 1.0


def directions(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The true direction d and a fixed push u, dense unit vectors, u orthogonal to d."""
    rng = np.random.default_rng([seed, 1])
    d = rng.choice([-1.0, 1.0], DIM) / np.sqrt(DIM)
    u = rng.choice([-1.0, 1.0], DIM)
    u = u - (u @ d) * d
    return d, u / np.linalg.norm(u)


def server_round(number: int, g: np.ndarray, steps: list[np.ndarray], flat: dict | None = None):
    """One round of the server's aggregation (its defaults unless `flat`) over updates `steps` from global `g`;
    the new global and the round's log."""
    cfg = ExperimentConfig.from_flat(flat or {})
    ctx = SimpleNamespace(number=number, log=RoundLog(number), exchange=SimpleNamespace(ordered=sorted))
    nodes = [101 + i for i in range(len(steps))]
    for node in nodes:
        ctx.log.client(node)["examples"] = 8
    master = {"w": g.astype(np.float32)}
    adapters = {n: {"w": (g + s).astype(np.float32)} for n, s in zip(nodes, steps)}
    out = aggregate_adapters(ctx, cfg, master, adapters, {n: 8.0 for n in nodes})
    return out["w"].astype(np.float64), ctx.log


def trajectory(seed: int, attack=None, attackers: int = 1, clients: int = 4, flat: dict | None = None,
               fraction: float = 1.0) -> np.ndarray:
    """The global after ROUNDS rounds; `attack(d, u, own_step)` gives each attacker's direction, sent at `fraction` of
    just under the strategy.median-clip bound (3 x the median of the round's norms, the attackers' on top)."""
    rng = np.random.default_rng(seed)
    d, u = directions(seed)
    g = np.zeros(DIM)
    for number in range(1, ROUNDS + 1):
        steps = [d + rng.normal(0.0, NOISE / np.sqrt(DIM), DIM) for _ in range(clients)]
        if attack is not None:
            norms = [float(np.linalg.norm(s)) for s in steps[attackers:]] + [np.inf] * attackers
            size = 0.999 * 3.0 * float(np.median(norms)) * fraction
            for i in range(attackers):
                direction = attack(d, u, steps[i])
                steps[i] = direction / np.linalg.norm(direction) * size
        g, _ = server_round(number, g, steps, flat)
    return g


PLAIN_MEAN = {"strategy.aggregation": "mean", "strategy.median-clip": 0.0}


def honest_progress(seed: int) -> float:
    return float(trajectory(seed, flat=PLAIN_MEAN) @ directions(seed)[0])


@pytest.mark.parametrize("seed", range(3))
def test_3_one_sign_flipping_client_of_4_keeps_half_of_the_honest_progress(seed):
    d, _ = directions(seed)
    kept = trajectory(seed, lambda d, u, own: -own) @ d / honest_progress(seed)
    assert kept >= 0.5


@pytest.mark.parametrize("seed", range(3))
def test_3_a_fixed_direction_pusher_of_4_moves_the_global_at_most_half_the_honest_displacement(seed):
    _, u = directions(seed)
    pushed = trajectory(seed, lambda d, u, own: u) @ u / honest_progress(seed)
    assert pushed <= 0.5


@pytest.mark.parametrize("seed", range(3))
def test_3_the_default_costs_an_honest_run_under_2_percent_of_the_plain_means_progress(seed):
    d, _ = directions(seed)
    assert trajectory(seed) @ d / honest_progress(seed) > 0.98


def test_3_a_round_of_2_replies_is_not_called_robust_and_takes_the_mean_only_when_asked():
    rng = np.random.default_rng(0)
    steps = [rng.normal(size=DIM), rng.normal(size=DIM)]
    g, log = server_round(1, np.zeros(DIM), steps)  # #54: by default it is kept
    assert log.extra["aggregated"] is False and not g.any() and "2 replies" in log.extra["kept_reason"]
    g, log = server_round(1, np.zeros(DIM), steps, {"strategy.apply-below-robust": True})
    assert log.extra["robust"] is False and "2 replies" in log.extra["robust_reason"]
    np.testing.assert_allclose(g, (steps[0] + steps[1]) / 2, rtol=1e-5, atol=1e-6)
    _, three = server_round(1, np.zeros(DIM), steps + [rng.normal(size=DIM)])
    assert three.extra["robust"] is True and "robust_reason" not in three.extra


def test_3_zero_update_sybils_count_as_one_vote_and_honest_clients_are_not_named_clipped(caplog):
    caplog.set_level(logging.WARNING, logger="pubswap_flwr")
    rng = np.random.default_rng(0)
    steps = [np.zeros(DIM)] * 3 + [rng.normal(size=DIM), rng.normal(size=DIM)]
    g, log = server_round(1, np.zeros(DIM), steps)  # #54: before, their median of 0 froze the round
    assert log.extra["robust"] is True and sorted(log.extra["idle"]["clients"]) == [101, 102, 103]
    assert np.linalg.norm(g) > 0.1 * min(np.linalg.norm(s) for s in steps[3:])
    assert "median_clip" not in log.extra
    assert "scaled down" not in caplog.text


# -- property tests ---------------------------------------------------------------------------------------------------
verifiers = st.sampled_from(["exact", "numeric", "rg"])
answers = st.one_of(st.none(), st.sampled_from(["11", "12", "1.5", "tac", "x"]), st.text(max_size=8))


@QUICK
@given(verifier=verifiers, answer=answers, which=st.integers(0, 4), provenance=st.sampled_from(["none", "own", "junk"]))
def test_peer_items_of_any_verifier_and_answer_are_trained_on_only_as_the_receiver_verifies_them(
        holder, verifier, answer, which, provenance):
    """Whatever a peer claims, rewards come from the receiver's own truth for the question, or it raises."""
    own = holder.learner.stream.items
    questions = [i.question for i in own] + ["What is 9 + 9?", "Is this forged?"]
    question = questions[which % len(questions)]
    prov = {"none": {}, "own": {"row": 0}, "junk": {"generator": "gcd", "config": {}, "seed": 1, "index": 2}}
    item = TaskItem("peer/1", "org", question, answer, verifier, {}, prov[provenance])
    completions = tagged("11", "1.5", "tac", str(answer))
    truth = next((i for i in own if i.question == question), None)
    try:
        rewards = holder.rescore(Packet("peer", item, completions))
    except ValueError:
        return
    assert truth is not None and truth.answer == answer
    assert rewards == [score_completion(c, truth).reward for c in completions]


@QUICK
@given(counts=st.lists(st.integers(0, 70), min_size=1, max_size=6), j=st.integers(0, 16), seed=st.integers(0, 99),
       weighted=st.booleans())
def test_no_packet_counts_per_sender_give_one_sender_more_than_its_fair_share_of_j(counts, j, seed, weighted):
    pool = [p for i, count in enumerate(counts) for p in _packets(f"s{i}", count)]
    random.Random(seed).shuffle(pool)
    weight = (lambda sender: 0.01 + int(sender[1:])) if weighted else None
    chosen = Counter(s.packet.sender for s in select_external(pool, j, exact, random.Random(seed), weight).chosen)
    available = {f"s{i}": c for i, c in enumerate(counts)}
    assert sum(chosen.values()) == min(j, len(pool))
    for s in available:
        for t in available:  # max-min fair: s has more than one over t only where t has nothing left to give
            assert chosen[s] <= chosen[t] + 1 or chosen[t] == available[t], (chosen, available)


@QUICK
@given(seed=st.integers(0, 10_000), angle=st.floats(0.0, np.pi), scale=st.floats(0.0, 1.0))
def test_any_direction_of_one_client_of_4_keeps_half_of_the_honest_progress(seed, angle, scale):
    """The attacker's direction anywhere in the plane of d and u (angle pi: the sign flip), at any size up to the
    clip bound; honest progress along d stays at least half the plain mean's without it."""
    d, _ = directions(seed)

    def attack(d, u, own):
        return np.cos(angle) * d + np.sin(angle) * u

    assert trajectory(seed, attack, fraction=scale) @ d / honest_progress(seed) >= 0.5
