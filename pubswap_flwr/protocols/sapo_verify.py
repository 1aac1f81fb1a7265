"""A SAPO receiver's check of a peer's item: the item it scores the peer's completions against is one it derives
itself, or the packet is dropped.

Per verifier: a reasoning-gym item ("rg") is regenerated from its provenance, only for task specs of the receiver's
own run (sapo.verify-provenance); any other item (an organization file's `exact`, `numeric` or registered verifier)
is verifiable only when the receiver's own data file holds an item with the same question, whose answer, verifier and
metadata it then uses (a peer answer that differs is a forgery). Nothing else can be checked: a question of the
receiver's own generated tasks sent under another verifier, say, carries an answer only the sender vouches for. Such
items raise `Unverifiable`, unless `sapo.accept-unverifiable` lets the receiver score them as sent.
"""

from __future__ import annotations

from ..algorithms.sapo_selection import Unverifiable
from ..config.catalog import SapoConfig
from ..node_runtime.learner import Learner
from ..tasks import TaskItem
from ..tasks.curriculum import at_level, has_curriculum, top_level
from ..tasks.specs import TaskSpec, generate_entry
from ..tasks.splits import RANGE


def verified_item(learner: Learner, item: TaskItem, sapo: SapoConfig) -> TaskItem:
    """The item a peer's completions are scored against (the peer's uid kept): regenerated from provenance, the
    receiver's own copy, or (sapo.accept-unverifiable) the item as sent. ValueError when the peer's item contradicts
    what the receiver derives (forged); Unverifiable when it derives nothing."""
    if item.verifier == "rg" and sapo.verify_provenance:
        return regenerated(learner, item)
    own = own_copy(learner, item)
    if own is not None:
        return own
    if sapo.accept_unverifiable:
        return item
    why = ("sapo.verify-provenance is off" if item.verifier == "rg" else
           "this node holds no item with that question in its own data")
    raise Unverifiable(f"cannot verify a {item.verifier!r} item: {why} (sapo.accept-unverifiable = false)")


def own_copy(learner: Learner, item: TaskItem) -> TaskItem | None:
    """The receiver's own item with the peer item's question, as the peer's uid; None when it holds none."""
    mine = learner.own_items(item.question)
    if not mine:
        return None
    answers = {(own.answer, own.verifier) for own in mine}
    if len(answers) > 1:
        raise Unverifiable(f"this node holds {len(mine)} items with that question and {len(answers)} different "
                           "answers or verifiers")
    own = mine[0]
    if item.answer != own.answer:
        raise ValueError("answer does not match this node's own answer for the question (forged)")
    return TaskItem(item.uid, own.task, own.question, own.answer, own.verifier, own.metadata, own.provenance,
                    own.family)


def runnable_specs(learner: Learner) -> list[TaskSpec]:
    """The task specs a peer's item may name: the run's tasks, and with tasks.curriculum each of them at every level
    of its curriculum (peers draw their private items at their own levels; a bounded set, as the run's own tasks)."""
    tasks = list(learner.universe.tasks)
    if not learner.settings.tasks.curriculum:
        return tasks
    return tasks + [at_level(t, level) for t in tasks if has_curriculum(t) for level in range(top_level(t) + 1)]


def regenerated(learner: Learner, item: TaskItem) -> TaskItem:
    """A peer's reasoning-gym item checked against its provenance: the receiver regenerates it (only for task
    specs in its own run, so a peer cannot make it build arbitrary generators) and scores with the regenerated
    entry, so a forged answer or tampered metadata is caught."""
    prov = item.provenance
    spec = next((t for t in runnable_specs(learner) if t.generator == prov.get("generator")
                 and dict(t.config) == dict(prov.get("config") or {})), None)
    if spec is None:
        raise ValueError(f"provenance names a task this node does not run: {prov.get('generator')!r}")
    seed, index = prov.get("seed"), prov.get("index")
    if not isinstance(seed, int) or not isinstance(index, int) or seed < 0 or not 0 <= index < RANGE:
        raise ValueError("provenance has no valid seed and index")
    entry = generate_entry(spec.generator, spec.config, seed, index)
    if entry["question"] != item.question:
        raise ValueError("question does not match its provenance")
    if (None if entry["answer"] is None else str(entry["answer"])) != item.answer:
        raise ValueError("answer does not match its provenance (forged)")
    return TaskItem(item.uid, spec.name, entry["question"], item.answer, "rg", entry["metadata"],
                    {"generator": spec.generator, "config": dict(spec.config), "seed": seed, "index": index},
                    item.family)
