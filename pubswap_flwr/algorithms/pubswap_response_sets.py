"""PubSwap response-set construction for one public prompt: the Balanced, Random and None rules. Pure functions.

Balanced (PubSwap): client n with c_n correct of its own K responses keeps its own K when c_n >= K/2; otherwise
it gets up to K/2 − c_n of its *incorrect* responses replaced by *correct* responses from *other* clients (fewer when
fewer donors exist). For odd K the count is rounded up, ceil(K/2) − c_n: the smallest number of swaps after which
the rule's own keep condition c >= K/2 holds. Which incorrect responses are replaced, and which donors fill them,
is uniform at random from a seeded RNG. Random: K responses drawn uniformly without replacement from the pooled
N·K responses to that prompt (the client's own included). None (an ablation, not in the paper): every client keeps
its own K, so public steps train on public prompts without any swapping.

Receiver-aware donors (`donor = "likely"`, beyond the paper): Balanced picks the slots as above, but instead of
drawing the donors the server hands the client its candidates (every correct donor response, at most
`max_candidates` drawn at random); the client keeps the ones its current policy finds most likely (`most_likely`),
i.e. the foreign text closest to what it would sample itself. The scoring happens on the receiver, over public
prompts and public responses only, so nothing private moves.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Response:
    """One client's response to a public prompt, scored by the server's verifier."""

    client: str
    index: int  # position in that client's K responses
    text: str
    reward: float
    behaviour: Any = None  # the donor's sampling ids and log-probs (train.foreign-correction = "is"), carried along


def is_correct(response: Response, threshold: float) -> bool:
    return response.reward >= threshold


def swaps_needed(correct: int, k: int) -> int:
    """Responses to swap in for a client with `correct` of `k` right: ceil(k/2) − correct, or 0."""
    return max(0, math.ceil(k / 2) - correct)


def balanced(own: Sequence[Response], pool: Sequence[Response], threshold: float, rng: random.Random) -> list[Response]:
    """The Balanced response set for the client that wrote `own`; `pool` is every client's responses to the prompt.

    Positions are kept: a replaced response's slot holds its donor, so the set has len(own) entries.
    """
    if not own:
        return []
    me = own[0].client
    k = len(own)
    correct = sum(is_correct(r, threshold) for r in own)
    need = swaps_needed(correct, k)
    if need == 0:
        return list(own)
    donors = [r for r in pool if r.client != me and is_correct(r, threshold)]
    wrong_slots = [i for i, r in enumerate(own) if not is_correct(r, threshold)]
    count = min(need, len(donors), len(wrong_slots))
    if count == 0:
        return list(own)
    slots = rng.sample(wrong_slots, count)
    chosen = rng.sample(donors, count)
    out = list(own)
    for slot, donor in zip(slots, chosen):
        out[slot] = donor
    return out


@dataclass(frozen=True)
class DonorChoice:
    """donor = likely: the client's own slots to fill and the correct donor responses to fill them from."""

    slots: tuple[int, ...]
    candidates: tuple[Response, ...]


def balanced_choice(own: Sequence[Response], pool: Sequence[Response], threshold: float, rng: random.Random,
                    max_candidates: int) -> DonorChoice | None:
    """Balanced's slots for the client that wrote `own`, with up to `max_candidates` donors to choose from (None
    when the client keeps its own K: it is not failing, or nobody else answered right)."""
    if not own:
        return None
    me = own[0].client
    need = swaps_needed(sum(is_correct(r, threshold) for r in own), len(own))
    donors = [r for r in pool if r.client != me and is_correct(r, threshold)]
    wrong_slots = [i for i, r in enumerate(own) if not is_correct(r, threshold)]
    count = min(need, len(donors), len(wrong_slots))
    if count == 0:
        return None
    slots = tuple(sorted(rng.sample(wrong_slots, count)))
    candidates = tuple(rng.sample(donors, max_candidates)) if len(donors) > max_candidates else tuple(donors)
    return DonorChoice(slots, candidates)


def most_likely(scores: Sequence[float], count: int) -> list[int]:
    """Indices of the `count` highest scores, highest first (equal scores: the earlier first)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:count]


def random_set(pool: Sequence[Response], k: int, rng: random.Random) -> list[Response]:
    """K responses uniformly without replacement from the pooled responses to the prompt."""
    if k > len(pool):
        raise ValueError(f"cannot draw {k} responses from a pool of {len(pool)}")
    return rng.sample(list(pool), k)


def own_set(own: Sequence[Response], pool: Sequence[Response], k: int, rng: random.Random) -> list[Response]:
    """The client's own responses, unchanged (the "none" rule)."""
    return list(own)


# rule -> the response set of the client that wrote `own`, from (own, pool, k, rng, threshold)
RULES = {
    "balanced": lambda own, pool, k, rng, threshold: balanced(own, pool, threshold, rng),
    "random": lambda own, pool, k, rng, threshold: random_set(pool, k, rng),
    "none": lambda own, pool, k, rng, threshold: own_set(own, pool, k, rng),
}


@dataclass(frozen=True)
class SwapOutcome:
    """A client's response set for one prompt, with what changed."""

    responses: list[Response]
    swapped: int  # responses in the set that came from other clients
    donors_available: int  # correct responses from other clients for this prompt
    own_correct: int
    choice: DonorChoice | None = None  # donor = likely: the client fills `responses`' slots from these


def build_response_sets(pool: Sequence[Response], rule: str, threshold: float, k: int,
                        rng: random.Random, donor: str = "uniform", max_candidates: int = 8) -> dict[str, SwapOutcome]:
    """Every client's response set for one prompt under `rule` ("balanced" | "random" | "none"); with Balanced
    and `donor` "likely", each failing client gets its own K and a DonorChoice instead of drawn donors."""
    if rule not in RULES:
        raise ValueError(f"unknown swap rule {rule!r}; expected one of {sorted(RULES)}")
    if donor not in ("uniform", "likely"):
        raise ValueError(f"unknown donor choice {donor!r}; expected 'uniform' or 'likely'")
    by_client: dict[str, list[Response]] = {}
    for response in pool:
        by_client.setdefault(response.client, []).append(response)
    out = {}
    for client in sorted(by_client):
        own = sorted(by_client[client], key=lambda r: r.index)
        donors = sum(r.client != client and is_correct(r, threshold) for r in pool)
        correct = sum(is_correct(r, threshold) for r in own)
        if rule == "balanced" and donor == "likely":
            choice = balanced_choice(own, pool, threshold, rng, max_candidates)
            out[client] = SwapOutcome(list(own), len(choice.slots) if choice else 0, donors, correct, choice)
            continue
        chosen = RULES[rule](own, pool, k, rng, threshold)
        out[client] = SwapOutcome(responses=chosen, swapped=sum(r.client != client for r in chosen),
                                  donors_available=donors, own_correct=correct)
    return out


def rewards_after_swap(outcome: SwapOutcome) -> list[float]:
    """The rewards of the response set a client trains on. With donor = likely the client fills the slots itself,
    so each slot counts at the lowest candidate's reward: every candidate is correct, and under 0/1 rewards they are
    all equal, so the value is exact there."""
    rewards = [r.reward for r in outcome.responses]
    if outcome.choice is not None and outcome.choice.candidates:
        lowest = min(r.reward for r in outcome.choice.candidates)
        for slot in outcome.choice.slots:
            rewards[slot] = lowest
    return rewards
