"""The held-out estimator: sampled pass@1 averages n samples per item, with its standard error over items, overall
and per task; greedy pass@1 stays one greedy sample per item."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from pubswap_flwr.evaluation import evaluate, item_estimates, mean_and_se
from pubswap_flwr.settings import EvalSettings
from pubswap_flwr.tasks import TaskItem


def test_mean_and_standard_error_on_hand_computed_values():
    mean, se = mean_and_se([1.0, 0.0, 0.5, 0.5])
    assert mean == 0.5
    assert se == pytest.approx(math.sqrt((0.25 + 0.25 + 0 + 0) / 3 / 4))  # sample SD / sqrt(n)
    assert mean_and_se([0.25]) == (0.25, 0.0)


def test_item_estimates_count_full_rewards_as_correct():
    accuracy, reward = item_estimates([[1.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    assert accuracy == [0.5, 0.0] and reward == [0.625, 0.0]


class ScriptedPolicy:
    """Answers greedy with `greedy[uid]` and sampled with the texts in `sampled[uid]` (cycled); with `can_mix_greedy`
    a call can ask for the first `greedy_first` completions of each item greedy and the rest sampled."""

    def __init__(self, greedy: dict[str, str], sampled: dict[str, list[str]], can_mix_greedy: bool = False):
        self.greedy, self.sampled, self.calls = greedy, sampled, []
        self.can_mix_greedy = can_mix_greedy

    def sample(self, items, k, *, greedy=False, with_logprobs=True, greedy_first=0):
        assert greedy_first == 0 or self.can_mix_greedy
        self.calls.append((len(items), k, greedy) + ((greedy_first,) if greedy_first else ()))
        if greedy:
            return [[SimpleNamespace(text=self.greedy[i.uid])] for i in items]
        return [[SimpleNamespace(text=self.greedy[i.uid])] * greedy_first
                + [SimpleNamespace(text=self.sampled[i.uid][j % len(self.sampled[i.uid])])
                   for j in range(k - greedy_first)] for i in items]


def _item(uid: str, task: str, answer: str) -> TaskItem:
    return TaskItem(uid, task, f"question {uid}", answer, "exact")


def test_sampled_pass_at_1_averages_n_samples_per_item_with_its_standard_error():
    items = [_item("a", "t1", "1"), _item("b", "t1", "2"), _item("c", "t2", "3")]
    right, wrong = "<answer>{}</answer>", "<answer>x</answer>"
    policy = ScriptedPolicy({"a": right.format(1), "b": wrong, "c": wrong},
                            {"a": [right.format(1)] * 4, "b": [right.format(2), wrong, wrong, wrong],
                             "c": [wrong, right.format(3)]})
    out = evaluate(policy, items, EvalSettings(samples=4, batch_size=8))
    # per item sampled accuracy: a 1, b 1/4, c 2/4 -> mean 7/12; SE = sd([1, .25, .5]) / sqrt(3)
    assert out["sampled_accuracy"] == pytest.approx(7 / 12)
    sd = math.sqrt(((1 - 7 / 12) ** 2 + (0.25 - 7 / 12) ** 2 + (0.5 - 7 / 12) ** 2) / 2)
    assert out["sampled_accuracy_se"] == pytest.approx(sd / math.sqrt(3))
    assert out["per_task"]["t1"]["sampled_accuracy"] == pytest.approx(0.625)
    assert out["per_task"]["t2"] == {"greedy_accuracy": 0.0, "greedy_reward": 0.0, "sampled_accuracy": 0.5,
                                     "sampled_reward": 0.5, "sampled_accuracy_se": 0.0, "sampled_reward_se": 0.0,
                                     "constant_accuracy": 1.0, "constant_answer": "3",
                                     "greedy_modal_share": 1.0, "greedy_modal_answer": "x",
                                     "sampled_modal_share": 0.5, "sampled_modal_answer": "x"}
    # each item's correct counts, in item order, for item-level intervals (eval_items.jsonl)
    assert out["item_results"] == {"uids": ["a", "b", "c"], "tasks": ["t1", "t1", "t2"], "greedy": [1, 0, 0],
                                   "sampled": [4, 1, 2], "samples": 4}
    assert out["greedy_accuracy"] == pytest.approx(1 / 3) and out["samples"] == 4 and out["items"] == 3
    # 8 completions per generate call: two items x 4 samples, then one
    assert [c for c in policy.calls if not c[2]] == [(2, 4, False), (1, 4, False)]


def test_samples_must_be_positive():
    with pytest.raises(ValueError, match="samples per item must be >= 1, got 0"):
        evaluate(ScriptedPolicy({}, {}), [_item("a", "t", "1")], EvalSettings(samples=0))


def test_lenient_accuracy_and_well_formed_share_are_reported_beside_strict():
    items = [_item("a", "t1", "12"), _item("b", "t1", "7"), _item("c", "t2", "olleh")]
    policy = ScriptedPolicy({"a": "7 + 5 = 12.", "b": "<answer>7</answer>", "c": "It is olleh"},
                            {"a": ["so 12", "<answer>12</answer>"], "b": ["<answer>7</answer> and 8", "9"],
                             "c": ["hello", "olleh"]})
    out = evaluate(policy, items, EvalSettings(samples=2, batch_size=8, lenient=True))
    assert out["greedy_accuracy"] == pytest.approx(1 / 3)  # strict: only b's tagged answer
    assert out["greedy_lenient_accuracy"] == pytest.approx(1.0)  # last number / last word
    assert out["greedy_well_formed"] == pytest.approx(1 / 3)
    # sampled, per item: a strict 1/2 lenient 2/2; b strict 1/2 (tagged 7, text after) lenient 1/2; c 0 and 1/2
    assert out["sampled_accuracy"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert out["sampled_lenient_accuracy"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert out["sampled_well_formed"] == pytest.approx((0.5 + 0 + 0) / 3)
    assert out["per_task"]["t2"]["sampled_lenient_accuracy"] == 0.5
    assert "sampled_lenient_accuracy_se" in out and "greedy_lenient_accuracy" not in evaluate(policy, items)


def test_lenient_answer_rules():
    from pubswap_flwr.tasks import lenient_answer

    assert lenient_answer("28 - 64 = -36, so -36.", "-36") == "-36"
    assert lenient_answer("Simplified: 14/21 is 2/3", "2/3") == "2/3"
    assert lenient_answer("x <answer> 5 </answer> then 7", "7") == "5"  # a tagged answer always wins
    assert lenient_answer("backward it reads 'tserc'.", "tserc") == "tserc"
    assert lenient_answer("no digits here", "4") is None


def _gcd_items(count: int) -> list[TaskItem]:
    """gcd-like items whose gold is "1" on a quarter of them (the share the real-model shortcut scored)."""
    golds = ["1" if i % 4 == 0 else str(2 + i % 7) for i in range(count)]
    return [TaskItem(f"g{i}", "gcd", f"gcd question {i}", gold, "exact") for i, gold in enumerate(golds)]


def test_a_constant_answer_policy_is_flagged_as_a_shortcut_with_the_constant_baseline_beside_it():
    items = _gcd_items(40) + [_item("s", "sum", "5")]
    answers = {i.uid: "<answer>1</answer>" for i in items}  # "1" to every question, as the real-model adapters did
    policy = ScriptedPolicy(answers, {uid: [text] for uid, text in answers.items()})
    out = evaluate(policy, items, EvalSettings(samples=2, batch_size=8))
    gcd = out["per_task"]["gcd"]
    assert gcd["greedy_accuracy"] == pytest.approx(0.25)  # exactly the constant's score: no skill at all
    assert gcd["constant_accuracy"] == pytest.approx(10 / 40) and gcd["constant_answer"] == "1"
    assert gcd["greedy_modal_share"] == 1.0 and gcd["greedy_modal_answer"] == "1"
    assert gcd["sampled_modal_share"] == 1.0
    assert out["greedy_shortcut_tasks"] == ["gcd"] and out["sampled_shortcut_tasks"] == ["gcd"]


def test_a_policy_that_answers_each_question_is_not_flagged():
    items = _gcd_items(40)
    answers = {i.uid: f"<answer>{i.answer}</answer>" for i in items}
    policy = ScriptedPolicy(answers, {uid: [text] for uid, text in answers.items()})
    out = evaluate(policy, items, EvalSettings(samples=1, batch_size=8))
    assert out["greedy_accuracy"] == 1.0 and out["per_task"]["gcd"]["greedy_modal_share"] == pytest.approx(0.25)
    assert out["greedy_shortcut_tasks"] == [] and out["sampled_shortcut_tasks"] == []


def test_a_task_whose_gold_answers_are_one_value_is_not_flagged_for_matching_them():
    items = [_item(f"y{i}", "yes", "yes") for i in range(10)]
    policy = ScriptedPolicy({i.uid: "<answer>yes</answer>" for i in items}, {})
    out = evaluate(policy, items, EvalSettings(sampled=False))
    assert out["per_task"]["yes"]["constant_accuracy"] == 1.0 and out["greedy_shortcut_tasks"] == []


def test_a_policy_that_mixes_greedy_and_sampled_rows_is_evaluated_in_one_pass_with_the_same_results():
    items = [_item("a", "t1", "1"), _item("b", "t1", "2"), _item("c", "t2", "3")]
    right, wrong = "<answer>{}</answer>", "<answer>x</answer>"
    greedy = {"a": right.format(1), "b": wrong, "c": wrong}
    sampled = {"a": [right.format(1)] * 4, "b": [right.format(2), wrong, wrong, wrong], "c": [wrong, right.format(3)]}
    apart = ScriptedPolicy(greedy, sampled)
    together = ScriptedPolicy(greedy, sampled, can_mix_greedy=True)
    progress: list[tuple] = []
    expected = evaluate(apart, items, EvalSettings(samples=4, batch_size=10, lenient=True))
    got = evaluate(together, items, EvalSettings(samples=4, batch_size=10, lenient=True),
                   progress=lambda *args: progress.append(args))
    assert got == expected
    # 10 sequences per call: two items x (1 greedy + 4 sampled), then one; no separate greedy pass
    assert together.calls == [(2, 5, False, 1), (1, 5, False, 1)]
    assert progress == [("greedy + sampled", 2, 3), ("greedy + sampled", 3, 3)]
    assert apart.calls == [(3, 1, True), (2, 4, False), (1, 4, False)]


def test_without_sampling_the_greedy_pass_runs_alone_even_when_rows_could_mix():
    items = [_item("a", "t1", "1")]
    policy = ScriptedPolicy({"a": "<answer>1</answer>"}, {}, can_mix_greedy=True)
    out = evaluate(policy, items, EvalSettings(sampled=False))
    assert policy.calls == [(1, 1, True)] and out["greedy_accuracy"] == 1.0 and "sampled_accuracy" not in out


def test_an_items_results_do_not_depend_on_how_items_are_split(tiny_policy, monkeypatch):
    """Per-item random streams (#55): the same per-item greedy and sampled counts whatever the batch size, the
    order of the items, a split into two calls (as two processes would evaluate them) or separate greedy and sampled
    passes; the evaluation's seed still changes the sampled ones."""
    from pubswap_flwr import evaluation
    from pubswap_flwr.tasks import HeldOutSet, parse_mix

    items = HeldOutSet.build(parse_mix("basic_arithmetic:1,gcd:1,count_bits:1"), per_task=4).items
    settings = EvalSettings(samples=3, batch_size=256, seed=11, lenient=True)

    def per_item(chosen, **changes):
        out = evaluate(tiny_policy, chosen, replace(settings, **changes))["item_results"]
        return {uid: (g, s) for uid, g, s in zip(out["uids"], out["greedy"], out["sampled"])}

    whole = per_item(items)
    assert per_item(items, batch_size=4) == whole
    assert per_item(items[::-1]) == whole
    assert {**per_item(items[:5]), **per_item(items[5:])} == whole
    monkeypatch.setattr(evaluation, "SHARED_PREFILL", False)
    assert per_item(items) == whole
    other_seed = [per_item(items, seed=seed) for seed in (12, 13, 14)]
    assert any(result != whole for result in other_seed)
    assert all({uid: g for uid, (g, _) in result.items()} == {uid: g for uid, (g, _) in whole.items()}
               for result in other_seed)  # greedy does not sample


def test_workers_sample_at_once_on_one_thread_each_with_the_same_results(tiny_policy, monkeypatch):
    """eval.workers (#55): calls run at once in threads of one torch thread each, over batches of
    batch-size / workers sequences; every item's results are those of one call at a time, and the process's torch
    threads are as before afterwards."""
    import threading

    import torch

    from pubswap_flwr.tasks import HeldOutSet, parse_mix

    items = HeldOutSet.build(parse_mix("basic_arithmetic:1,gcd:1,count_bits:1"), per_task=4).items
    settings = EvalSettings(samples=3, batch_size=16, seed=11, lenient=True, workers=1)
    calls: list[tuple[int, int, int]] = []  # (thread, its torch threads, items) per call
    real = tiny_policy._sample_merged

    def recorded(chosen, k, **options):
        calls.append((threading.get_ident(), torch.get_num_threads(), len(chosen)))
        return real(chosen, k, **options)

    monkeypatch.setattr(tiny_policy, "_sample_merged", recorded)
    before = torch.get_num_threads()
    alone = evaluate(tiny_policy, items, settings)
    assert [n for _, _, n in calls] == [4, 4, 4] and len({t for t, _, _ in calls}) == 1  # 16 // 4 items a call
    for workers in (2, 3):
        calls.clear()
        together = evaluate(tiny_policy, items, replace(settings, workers=workers))
        assert together == alone
        assert sum(n for _, _, n in calls) == len(items)
        assert max(n for _, _, n in calls) == 16 // workers // 4  # the batch shared among the workers
        assert len({t for t, _, _ in calls}) > 1 and threading.get_ident() not in {t for t, _, _ in calls}
        assert {threads for _, threads, _ in calls} == {1}
        assert torch.get_num_threads() == before
