"""tasks.trl-rewards: reward functions in TRL's shape (`f(prompts, completions, **columns) -> list[float | None]`),
scored a group at a time in the isolated worker: the key's syntax, what the function receives, None, refused
replies, the batch's time limit, the start-up import check, a 1-round run that trains on them, and verify."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.server import preflight
from pubswap_flwr.tasks import TaskItem
from pubswap_flwr.tasks.prompts import user_message
from pubswap_flwr.tasks.rewards import RewardRef, TrlReward, parse_trl_rewards
from pubswap_flwr.tasks.verifiers import score_trl_group

FIXTURES = "tests.unit.trl_reward_fixtures"
GCD = TaskItem("u/1", "gcd", "What is the GCD of 12 and 40?", "4", "rg", provenance={"generator": "gcd"})


def trl(*functions: str) -> TrlReward:
    return TrlReward(tuple(RewardRef(FIXTURES, name) for name in functions))


# --- the key's syntax ----------------------------------------------------------------------------------------------

def test_trl_rewards_key_names_sums_of_functions_per_task():
    table = parse_trl_rewards(f"gcd=examples.trl_reward:reward_len+examples.trl_reward:format_reward,"
                              f"{FIXTURES}:tenth_per_char")
    assert table.for_task("gcd") == TrlReward((RewardRef("examples.trl_reward", "reward_len"),
                                               RewardRef("examples.trl_reward", "format_reward")))
    assert table.for_task("gcd").name == "examples.trl_reward:reward_len+examples.trl_reward:format_reward"
    assert table.for_task("chain_sum") == trl("tenth_per_char")
    assert parse_trl_rewards("").empty and parse_trl_rewards("").for_task("gcd") is None
    assert ExperimentConfig.from_flat({}).tasks.trl_rewards == ""


@pytest.mark.parametrize("text, message", [
    ("examples.trl_reward", r"tasks.trl-rewards: 'examples.trl_reward' is not module:function \(no ':'\)"),
    ("gcd=a:b+", r"tasks.trl-rewards: 'gcd=a:b\+' has an empty name in its sum"),
    ("gcd=a:b,gcd=c:d", r"tasks.trl-rewards: task 'gcd' is listed twice"),
    ("a:b,c:d", r"tasks.trl-rewards: two rewards without a task"),
])
def test_trl_rewards_bad_syntax_is_a_config_error_naming_the_key(text, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig.from_flat({"tasks.trl-rewards": text})


@pytest.mark.parametrize("name, message", [
    ("examples.no_such_module:f", r"tasks.trl-rewards: module 'examples.no_such_module' of "
                                  r"'examples.no_such_module:f' cannot be imported"),
    ("examples.trl_reward:missing", r"tasks.trl-rewards: module 'examples.trl_reward' has no attribute 'missing'"),
])
def test_trl_rewards_that_do_not_import_stop_the_run_at_the_pre_check(name, message):
    with pytest.raises(ConfigError, match=message):
        preflight.check({"tasks.trl-rewards": f"gcd=examples.trl_reward:reward_len+{name}"}, run_dir=False)


# --- scoring a group in the worker ---------------------------------------------------------------------------------

def test_trl_reward_gets_prompts_whole_completions_and_the_items_columns(tmp_path):
    record = tmp_path / "called.json"
    item = TaskItem("u/7", "gcd", "What is the GCD of 6 and 9?", "3", "rg",
                    metadata={"record_to": str(record), "level": 2}, provenance={"generator": "gcd"})
    completions = ["<answer>3</answer>", "I think <answer>9</answer> done", "no tags"]
    scores = score_trl_group(completions, item, trl("records_its_arguments"))
    assert [s.reward for s in scores] == [18.0, 31.0, 7.0]  # unclipped: the function's values as they are
    assert all(s.reason is None and s.trl for s in scores)
    called = json.loads(record.read_text())
    assert called["completions"] == completions  # whole texts, tags and all, also one without tags
    assert called["prompts"] == [user_message("What is the GCD of 6 and 9?", "plain")] * 3
    kwargs = called["kwargs"]
    assert kwargs["question"] == ["What is the GCD of 6 and 9?"] * 3
    assert kwargs["answer"] == ["3"] * 3 and kwargs["task"] == ["gcd"] * 3 and kwargs["uid"] == ["u/7"] * 3
    assert kwargs["level"] == [2] * 3 and kwargs["record_to"] == [str(record)] * 3


def test_trl_rewards_of_several_functions_are_summed_and_none_gives_nothing():
    scores = score_trl_group(["<answer>4</answer>", "<answer>5</answer>"], GCD,
                             trl("none_for_the_first", "tenth_per_char"))
    assert [s.reward for s in scores] == pytest.approx([1.8, 0.25 + 1.8])  # 18 characters each


def test_a_completion_every_trl_function_gives_none_is_scored_by_the_tasks_own_reward():
    scores = score_trl_group(["<answer>4</answer>", "<answer>5</answer>", "4"], GCD, trl("always_none"))
    assert [(s.reward, s.trl) for s in scores[:2]] == [(1.0, False), (0.0, False)]  # the gcd verifier
    assert scores[2].reason == "no <answer>...</answer> in completion"
    half = RewardRef("tests.unit.reward_fixtures", "half_for_any_answer")  # or tasks.rewards' function for the task
    assert [s.reward for s in score_trl_group(["<answer>5</answer>"], GCD, trl("always_none"), fallback=half)] == [0.5]


@pytest.mark.parametrize("function, message", [
    ("returns_a_dict", "returned a dict, not a list of rewards (one per completion)"),
    ("returns_one_number", "returned a float, not a list of rewards (one per completion)"),
    ("returns_one_too_few", "returned 2 rewards for 3 completions"),
    ("returns_text", "returned 'high' for completion 0, not a number or None"),
    ("returns_a_bool", "returned True for completion 0, not a number or None"),
    ("returns_nan", "returned nan for completion 0, not a finite number in [-1e+06, 1e+06]"),
    ("returns_huge", "returned 1e+300 for completion 0, not a finite number in [-1e+06, 1e+06]"),
])
def test_a_trl_reply_that_is_not_one_number_per_completion_is_refused(function, message):
    scores = score_trl_group(["<answer>4</answer>", "<answer>1</answer>", "x"], GCD, trl(function))
    expected = f"scorer error: RewardError: tasks.trl-rewards: {FIXTURES}:{function} {message}"
    assert [(s.reward, s.reason) for s in scores] == [(0.0, expected)] * 3


def test_a_trl_reward_past_the_time_limit_costs_its_whole_batch_and_the_worker_goes_on():
    scores = score_trl_group(["<answer>4</answer>"] * 3, GCD, trl("sleeps_past_the_limit"), timeout_s=0.5)
    assert all(s.reward == 0.0 and s.timed_out for s in scores) and len(scores) == 3
    assert scores[0].reason == (f"scoring timeout: ScoringTimeout: reward {FIXTURES}:sleeps_past_the_limit hit the "
                                "0.5 s timeout")
    assert [s.reward for s in score_trl_group(["abc"], GCD, trl("tenth_per_char"))] == pytest.approx([0.3])


def test_a_conversational_trl_function_fails_with_a_hint_that_completions_are_text():
    scores = score_trl_group(["<answer>4</answer>"], GCD, trl("conversational"))
    assert scores[0].reward == 0.0
    assert scores[0].reason.startswith("scorer error: TypeError: string indices must be integers")
    assert "completions and prompts are plain strings, not chat messages (docs/own-reward.md)" in scores[0].reason


def test_a_trl_function_without_kwargs_fails_with_its_own_error_and_no_hint():
    [score] = score_trl_group(["<answer>4</answer>"], GCD, trl("takes_completions_only"))
    assert score.reward == 0.0
    assert score.reason == ("scorer error: TypeError: takes_completions_only() got an unexpected keyword argument "
                            "'prompts'")


def test_lines_a_trl_reward_prints_are_never_read_as_its_rewards():
    scores = score_trl_group(["<answer>4</answer>", "<answer>3</answer>"], GCD, trl("prints_forged_replies"))
    assert [s.reward for s in scores] == [0.25, 0.25]


def test_a_completion_over_the_limit_is_not_sent_and_gets_zero_with_the_reason():
    scores = score_trl_group(["abcd", "x" * 50], GCD, trl("tenth_per_char"), max_chars=20)
    assert scores[0].reward == pytest.approx(0.4)
    assert (scores[1].reward, scores[1].reason) == (0.0, "completion has 50 chars, over the 20 limit")


def test_the_trl_example_is_written_as_trls_docs_write_rewards():
    example = TrlReward((RewardRef("examples.trl_reward", "reward_len"),
                         RewardRef("examples.trl_reward", "format_reward")))
    texts = ["<answer>4</answer>", "The GCD is <answer>4</answer>, since 40 = 4 * 10 and 12 = 4 * 3."]
    scores = score_trl_group(texts, GCD, example)
    assert [s.reward for s in scores] == [-(20 - 18) + 1.0, -(len(texts[1]) - 20) + 0.0]


# --- a run ---------------------------------------------------------------------------------------------------------

RUN = {"seed": 5, "num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
       "train.completions-per-prompt": 4, "eval.items-per-task": 2, "eval.samples": 1,
       "tasks.mix": "gcd:1", "tasks.per-node": 0, "model.threads": 1, "run-name": "trl-reward",
       "tasks.trl-rewards": "examples.trl_reward:reward_len+examples.trl_reward:format_reward",
       "strategy.apply-below-robust": True}


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    from pubswap_flwr.simulation import simulate_in_process

    out = tmp_path_factory.mktemp("runs")
    simulate_in_process({**RUN, "output.dir": str(out)}, 2)
    return out / "trl-reward"


def test_a_run_trains_on_trl_rewards_and_evaluates_with_the_verifier(trl_run):
    from pubswap_flwr.server.metrics import read_metrics

    rows = read_metrics(trl_run)
    trained = [c for row in rows for c in (row.get("clients") or {}).values()]
    assert len(trained) == 2 and all(c.get("status", "ok") == "ok" for c in trained)
    for client in trained:
        # reward_len pays -|20 - len|: no verifier (rewards in [0, 1]) gives a negative training reward
        assert client["train_reward"] < 0
    evals = [row["eval"] for row in rows if row.get("eval")]
    assert len(evals) == 2 and all(0.0 <= e["greedy_reward"] <= 1.0 for e in evals)


def test_verify_imports_a_runs_trl_rewards_only_when_told(trl_run):
    from pubswap_flwr.results.verify import VerifyError, run_rewards

    cfg = ExperimentConfig.from_flat(json.loads((trl_run / "config.json").read_text())["config"])
    table, note = run_rewards(cfg, import_rewards=False, run_dir=trl_run)
    assert table.empty and note is None  # held-out scores never use them: nothing differs from the run's
    table, note = run_rewards(cfg, import_rewards=True, run_dir=trl_run)
    assert table.empty
    assert note == (f"the run's tasks.trl-rewards ({RUN['tasks.trl-rewards']!r}) import; they scored training "
                    "rollouts only, so the held-out scores here use the items' verifiers as the run's did")
    bad = ExperimentConfig.from_flat({"tasks.trl-rewards": "examples.trl_reward:missing"})
    with pytest.raises(VerifyError, match="--import-rewards: tasks.trl-rewards: module 'examples.trl_reward' has no "
                                          "attribute 'missing'"):
        run_rewards(bad, import_rewards=True, run_dir=trl_run)
