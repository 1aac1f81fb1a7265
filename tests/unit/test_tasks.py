"""Task specs and mixtures, seed ranges, and the disjoint held-out / public / private splits."""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest

from pubswap_flwr.tasks import (
    DEFAULT_MIX,
    PRESETS,
    HeldOutSet,
    ItemListStream,
    MixtureStream,
    PublicSet,
    StreamCursor,
    TaskError,
    TaskItem,
    TaskSpec,
    node_mixes,
    parse_custom_tasks,
    parse_mix,
)
from pubswap_flwr.tasks.specs import generate_entry, known_task_names
from pubswap_flwr.tasks.splits import (
    DATA_SEED_STRIDE,
    MAX_TASKS,
    RANGE,
    SPLIT_BASE,
    question_key,
    rg_item,
    stream_seed,
    unique_items,
)

# --- parse_mix ----------------------------------------------------------------------------------------------------


def test_parse_mix_weights_and_presets():
    specs = parse_mix("gcd:2, count_bits ,spell_backward:0.5")
    assert [s.name for s in specs] == ["gcd", "count_bits", "spell_backward"]
    assert [s.weight for s in specs] == [2.0, 1.0, 0.5]
    assert specs[0].generator == "gcd" and dict(specs[0].config) == dict(PRESETS["gcd"].config)
    assert PRESETS["gcd"].weight == 1.0  # presets are not mutated by with_weight


def test_default_mix_parses():
    specs = parse_mix(DEFAULT_MIX)
    assert [(s.name, s.weight) for s in specs] == [
        ("basic_arithmetic", 1.0), ("gcd", 1.0), ("count_bits", 1.0), ("fraction_simplification", 1.0),
        ("spell_backward", 2.0)]


def test_unknown_task_error_lists_known_names():
    with pytest.raises(TaskError) as info:
        parse_mix("gcd:1,arithmetics:1")
    message = str(info.value)
    assert message.startswith("tasks.mix: unknown task 'arithmetics'")
    assert "known tasks: " + ", ".join(sorted(PRESETS)) in message
    assert "rg:<reasoning-gym dataset name>" in message


def test_unknown_task_error_uses_the_given_key_and_lists_custom_names():
    custom = parse_custom_tasks('{"tiny_gcd": {"generator": "gcd", "config": {"max_value": 10}}}')
    with pytest.raises(TaskError, match=r"pubswap.public-mix: unknown task 'nope'.*tiny_gcd"):
        parse_mix("nope", custom, key="pubswap.public-mix")
    assert "tiny_gcd" in known_task_names(custom)


def test_duplicate_task_rejected():
    with pytest.raises(TaskError, match=r"tasks.mix: task 'gcd' is listed twice"):
        parse_mix("gcd:1,count_bits:1,gcd:2")


def test_rg_generator_form():
    specs = parse_mix("rg:leg_counting:3,rg:gcd")
    assert [(s.name, s.generator, dict(s.config), s.weight) for s in specs] == [
        ("rg:leg_counting", "leg_counting", {}, 3.0), ("rg:gcd", "gcd", {}, 1.0)]
    # rg:gcd (default config) and the gcd preset are different tasks
    assert [s.name for s in parse_mix("rg:gcd,gcd")] == ["rg:gcd", "gcd"]


@pytest.mark.parametrize("text", ["rg:not_a_dataset", "rg:composite", "rg:"])
def test_rg_unknown_generator_rejected(text):
    with pytest.raises(TaskError, match="is not a reasoning-gym dataset"):
        parse_mix(text)


@pytest.mark.parametrize("text,match", [
    ("gcd:abc", r"weight of 'gcd' is not a number: 'abc'"),
    ("gcd:0", r"weight of 'gcd' must be a finite number > 0, got 0.0"),
    ("gcd:-2", r"weight of 'gcd' must be a finite number > 0"),
    ("gcd:nan", r"weight of 'gcd' must be a finite number > 0, got nan"),
    ("gcd:inf", r"weight of 'gcd' must be a finite number > 0, got inf"),
    ("rg:gcd:x", r"weight of 'rg:gcd' is not a number"),
])
def test_bad_weight_rejected(text, match):
    with pytest.raises(TaskError, match=match):
        parse_mix(text)


@pytest.mark.parametrize("text", ["", " , ,", ","])
def test_empty_mix_rejected(text):
    with pytest.raises(TaskError, match="names no tasks"):
        parse_mix(text)


def test_parse_custom_tasks():
    custom = parse_custom_tasks('{"small_gcd": {"generator": "gcd", "config": {"max_value": 10}}, '
                                '"plain_chain": {"generator": "chain_sum"}}')
    assert custom["small_gcd"] == TaskSpec("small_gcd", "gcd", {"max_value": 10})
    assert dict(custom["plain_chain"].config) == {}
    specs = parse_mix("small_gcd:4,gcd", custom)
    assert (specs[0].generator, dict(specs[0].config), specs[0].weight) == ("gcd", {"max_value": 10}, 4.0)
    assert parse_custom_tasks("  ") == {}


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"x": {"config": {}}}', r"tasks.custom\['x'\] needs a string 'generator'"),
    ('{"x": {"generator": "gcd", "config": [1]}}', r"tasks.custom\['x'\].config must be an object"),
    ('{"x": {"generator": "no_such_generator"}}', "is not a reasoning-gym dataset"),
])
def test_parse_custom_tasks_errors(text, match):
    with pytest.raises(TaskError, match=match):
        parse_custom_tasks(text)


def test_bad_generator_config_is_a_task_error():
    spec = TaskSpec("bad", "gcd", {"no_such_option": 1})
    with pytest.raises(TaskError, match="reasoning-gym rejected config for 'gcd'"):
        rg_item("eval", spec, 1, 0, "u")


# --- seeds --------------------------------------------------------------------------------------------------------


def _assert_disjoint(starts: dict[tuple, int]) -> None:
    ordered = sorted(starts.items(), key=lambda kv: kv[1])
    for (name_a, a), (name_b, b) in zip(ordered, ordered[1:]):
        assert b - a >= RANGE, f"{name_a} [{a}, {a + RANGE}) overlaps {name_b} starting at {b}"


def test_stream_seed_ranges_never_overlap_for_public_eval_and_private_nodes():
    starts = {}
    for task in range(MAX_TASKS):
        starts[("public", 0, task)] = stream_seed("public", task)
        starts[("eval", 0, task)] = stream_seed("eval", task)
        for node in range(100):
            starts[("private", node, task)] = stream_seed("private", task, node)
    assert len(set(starts.values())) == len(starts)
    _assert_disjoint(starts)


def test_stream_seed_sft_is_disjoint_from_public_eval_and_first_private_node():
    starts = {}
    for task in range(MAX_TASKS):
        for split in ("public", "eval", "sft"):
            starts[(split, 0, task)] = stream_seed(split, task)
        starts[("private", 0, task)] = stream_seed("private", task, 0)
    _assert_disjoint(starts)


def test_stream_seed_private_nodes_vs_sft():
    starts = {("sft", 0, t): stream_seed("sft", t) for t in range(MAX_TASKS)}
    starts.update({("private", n, t): stream_seed("private", t, n) for n in range(3) for t in range(MAX_TASKS)})
    _assert_disjoint(starts)


def test_stream_seed_data_seed_shifts_every_split():
    for split in SPLIT_BASE:
        a, b = stream_seed(split, 3, 1, 0), stream_seed(split, 3, 1, 1)
        assert b - a == DATA_SEED_STRIDE


def test_stream_seed_node_only_matters_for_private():
    assert stream_seed("public", 2, node=5) == stream_seed("public", 2, node=0)
    assert stream_seed("eval", 2, node=5) == stream_seed("eval", 2, node=0)
    assert stream_seed("private", 2, node=5) != stream_seed("private", 2, node=0)


@pytest.mark.parametrize("args,match", [
    (("train", 0), "unknown split 'train'"),
    (("eval", MAX_TASKS), "task index 90 out of range"),
    (("eval", -1), "task index -1 out of range"),
    (("private", 0, -1), "node index -1 out of range"),
])
def test_stream_seed_errors(args, match):
    with pytest.raises(ValueError, match=match):
        stream_seed(*args)


# --- items --------------------------------------------------------------------------------------------------------


def test_rg_item_fields_and_regeneration_from_provenance():
    spec = PRESETS["gcd"]
    item = rg_item("eval", spec, 123, 4, "eval/gcd/4")
    assert (item.uid, item.task, item.verifier) == ("eval/gcd/4", "gcd", "rg")
    assert item.provenance == {"generator": "gcd", "config": dict(spec.config), "seed": 123, "index": 4,
                               "split": "eval"}
    entry = generate_entry("gcd", item.provenance["config"], item.provenance["seed"], item.provenance["index"])
    assert entry["question"] == item.question and str(entry["answer"]) == item.answer
    assert isinstance(item.answer, str)
    assert TaskItem.from_dict(item.to_dict()) == item


def test_unique_items_distinct_excluding_and_too_few():
    spec = TaskSpec("tiny_bits", "count_bits", {"max_n": 31})
    items = unique_items("eval", spec, 0, 31)
    assert len({i.question for i in items}) == 31
    first = unique_items("eval", spec, 0, 5)
    assert first == items[:5]  # stream order
    rest = unique_items("eval", spec, 0, 26, exclude={question_key(i.question) for i in first})
    assert not {i.question for i in rest} & {i.question for i in first}
    with pytest.raises(ValueError, match="too few distinct questions"):
        unique_items("eval", spec, 0, 32)


# --- splits: disjointness (acceptance criterion) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def splits():
    tasks = parse_mix(DEFAULT_MIX)
    held = HeldOutSet.build(tasks, 30)
    public = PublicSet.build(tasks, tasks, 40, held.questions)
    exclude = held.questions | {question_key(item.question) for item in public.items}
    mixes = node_mixes(tasks, 3, 2)
    private = [MixtureStream(mixes[n], tasks, n, exclude).take(200, StreamCursor()) for n in range(3)]
    return tasks, held, public, private


def test_heldout_public_private_share_no_question(splits):
    tasks, held, public, private = splits
    eval_q = held.questions
    public_q = {question_key(item.question) for item in public.items}
    assert len(held.items) == 30 * len(tasks) and len(eval_q) == len(held.items)
    assert len(public.items) == 40 and len(public_q) == 40
    assert not eval_q & public_q
    for node, items in enumerate(private):
        assert len(items) == 200
        private_q = {question_key(item.question) for item in items}
        assert not private_q & eval_q, f"node {node} private stream leaks eval questions"
        assert not private_q & public_q, f"node {node} private stream leaks public questions"


def test_split_uids_and_provenance(splits):
    tasks, held, public, private = splits
    assert all(i.uid.startswith("eval/") and i.provenance["split"] == "eval" for i in held.items)
    assert all(i.uid.startswith("public/") and i.provenance["split"] == "public" for i in public.items)
    for node, items in enumerate(private):
        assert all(i.uid.startswith(f"private/{node}/") for i in items)
        assert len({i.uid for i in items}) == len(items)


def test_private_streams_follow_node_mixes(splits):
    tasks, _held, _public, private = splits
    mixes = node_mixes(tasks, 3, 2)
    for node, items in enumerate(private):
        assert {i.task for i in items} == {s.name for s in mixes[node]}


def test_public_set_apportions_by_weight_and_is_seeded(splits):
    tasks, held, public, _ = splits
    # weights 1,1,1,1,2 over 40: 6.67 x4 and 13.33 -> largest remainders give 7,7,7,6,13
    assert Counter(i.task for i in public.items) == {"basic_arithmetic": 7, "gcd": 7, "count_bits": 7,
                                                      "fraction_simplification": 6, "spell_backward": 13}
    again = PublicSet.build(tasks, tasks, 40, held.questions)
    assert [i.uid for i in again.items] == [i.uid for i in public.items]
    other = PublicSet.build(tasks, tasks, 40, held.questions, seed=1)
    assert [i.uid for i in other.items] != [i.uid for i in public.items]
    assert sorted(i.uid for i in other.items) == sorted(i.uid for i in public.items)
    first = public.items[0]
    assert public.get(first.uid) is first and public.get("public/none/0") is None


def test_exclusion_is_active_on_a_tiny_question_space():
    # 31 distinct questions: eval takes 10, public 10, so the private stream may only use the other 11.
    tiny = [TaskSpec("tiny_bits", "count_bits", {"max_n": 31})]
    held = HeldOutSet.build(tiny, 10)
    public = PublicSet.build(tiny, tiny, 10, held.questions)
    exclude = held.questions | {question_key(i.question) for i in public.items}
    assert len(exclude) == 20
    items = MixtureStream(tiny, tiny, 0, exclude).take(60, StreamCursor())
    assert not {question_key(i.question) for i in items} & exclude
    assert len({i.question for i in items}) <= 11
    # without the exclusion the same raw stream does hit held-out questions, so the filter is what keeps them apart
    raw = MixtureStream(tiny, tiny, 0, set()).take(60, StreamCursor())
    assert {question_key(i.question) for i in raw} & held.questions


# --- MixtureStream ------------------------------------------------------------------------------------------------


def _stream(node=0, data_seed=0):
    tasks = parse_mix("gcd:1,count_bits:3")
    return MixtureStream(tasks, tasks, node, exclude=set(), data_seed=data_seed)


def test_mixture_stream_is_deterministic_and_resumable():
    s = _stream()
    whole = s.take(20, StreamCursor())
    cursor = StreamCursor()
    first = s.take(10, cursor)
    saved = cursor.to_dict()
    second = s.take(10, cursor)
    assert [i.uid for i in first + second] == [i.uid for i in whole]
    assert [i.question for i in first + second] == [i.question for i in whole]
    assert cursor.draws == 20
    assert sum(cursor.next_index.values()) == 20  # nothing excluded: one raw index per item
    # a fresh stream object (e.g. after a restart) with the saved cursor continues identically
    assert [i.uid for i in _stream().take(10, StreamCursor.from_dict(saved))] == [i.uid for i in second]
    assert _stream().take(0, StreamCursor()) == []


def test_stream_cursor_round_trip():
    cursor = StreamCursor()
    _stream().take(15, cursor)
    data = cursor.to_dict()
    assert data == {"draws": 15, "next_index": cursor.next_index}
    back = StreamCursor.from_dict(data)
    assert back == cursor and back.next_index is not cursor.next_index
    assert StreamCursor.from_dict({}) == StreamCursor()
    assert StreamCursor.from_dict({"draws": "3", "next_index": {"gcd": "2"}}) == StreamCursor(3, {"gcd": 2})


def test_mixture_stream_differs_by_node_and_data_seed():
    a = {i.question for i in _stream(node=0).take(30, StreamCursor())}
    b = {i.question for i in _stream(node=1).take(30, StreamCursor())}
    c = {i.question for i in _stream(node=0, data_seed=1).take(30, StreamCursor())}
    assert a != b and a != c


def test_mixture_stream_follows_weights():
    items = _stream().take(400, StreamCursor())
    share = sum(i.task == "count_bits" for i in items) / len(items)
    assert 0.65 < share < 0.85  # weight 3 of 4


def test_mixture_stream_items_are_regenerable_from_uid_index():
    items = _stream(node=2).take(5, StreamCursor())
    for item in items:
        node, task, index = re.fullmatch(r"private/(\d+)/(\w+)/(\d+)", item.uid).groups()
        assert (int(node), task, int(index)) == (2, item.task, item.provenance["index"])


# --- ItemListStream -----------------------------------------------------------------------------------------------


def _items(n):
    return [TaskItem(f"org/{i}", "org", f"q{i}", str(i), "exact") for i in range(n)]


def test_item_list_stream_cycles_with_reshuffle_per_epoch():
    stream = ItemListStream(_items(6), exclude=set(), seed=3)
    cursor = StreamCursor()
    epochs = [[i.uid for i in stream.take(6, cursor)] for _ in range(8)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(f"org/{i}" for i in range(6))  # every item once per epoch
    assert len({tuple(e) for e in epochs}) > 1  # the order changes between epochs
    assert cursor.draws == 48


def test_item_list_stream_is_deterministic_and_resumable():
    whole = [i.uid for i in ItemListStream(_items(5), set(), seed=1).take(13, StreamCursor())]
    cursor = StreamCursor()
    s = ItemListStream(_items(5), set(), seed=1)
    part = [i.uid for i in s.take(7, cursor)]
    resumed = ItemListStream(_items(5), set(), seed=1)  # new object, restored cursor
    part += [i.uid for i in resumed.take(6, StreamCursor.from_dict(cursor.to_dict()))]
    assert part == whole
    other = [i.uid for i in ItemListStream(_items(5), set(), seed=2).take(13, StreamCursor())]
    assert other != whole


def test_item_list_stream_drops_held_out_questions():
    stream = ItemListStream(_items(5), exclude={"q1", "q3", "not-there"}, seed=0)
    assert stream.dropped == 2
    got = stream.take(9, StreamCursor())
    assert {i.question for i in got} == {"q0", "q2", "q4"}
    with pytest.raises(ValueError, match="no items left after removing held-out questions"):
        ItemListStream(_items(2), exclude={"q0", "q1"})


# --- node_mixes ---------------------------------------------------------------------------------------------------


def test_node_mixes_round_robin_consecutive():
    tasks = [TaskSpec(n, "gcd") for n in "abcde"]
    names = lambda mixes: ["".join(s.name for s in m) for m in mixes]  # noqa: E731
    assert names(node_mixes(tasks, 3, 2)) == ["ab", "bc", "cd"]
    assert names(node_mixes(tasks, 7, 2)) == ["ab", "bc", "cd", "de", "ea", "ab", "bc"]
    assert names(node_mixes(tasks, 2, 3)) == ["abc", "bcd"]
    assert names(node_mixes(tasks, 2, 0)) == ["abcde", "abcde"]
    assert names(node_mixes(tasks, 2, 5)) == ["abcde", "abcde"]
    assert names(node_mixes(tasks, 2, 9)) == ["abcde", "abcde"]


def test_node_mixes_cover_every_task_when_enough_nodes():
    tasks = parse_mix(DEFAULT_MIX)
    mixes = node_mixes(tasks, len(tasks), 2)
    covered = {s.name for mix in mixes for s in mix}
    assert covered == {s.name for s in tasks}
    assert all(len(m) == 2 for m in mixes)
    assert list(itertools.chain.from_iterable(node_mixes(tasks, 1, 1))) == [tasks[0]]
