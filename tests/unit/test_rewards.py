"""tasks.rewards: user reward functions by module:function name, scored in the isolated worker under the built-ins'
time limit; config errors at start-up; a 1-round run that trains and evaluates with them; `pubswap ask` and verify's
--import-rewards."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.server import preflight
from pubswap_flwr.tasks import TaskItem, score_completion
from pubswap_flwr.tasks.rewards import RewardRef, parse_rewards

FIXTURES = "tests.unit.reward_fixtures"
GCD = TaskItem("u/1", "gcd", "What is the GCD of 12 and 40?", "40", "rg", provenance={"generator": "gcd"})


# --- the key's syntax ----------------------------------------------------------------------------------------------

def test_one_name_rewards_every_task_and_task_entries_override_it():
    table = parse_rewards("gcd=examples.my_reward:reward, tests.unit.reward_fixtures:half_for_any_answer")
    assert table.for_task("gcd") == RewardRef("examples.my_reward", "reward")
    assert table.for_task("chain_sum") == RewardRef(FIXTURES, "half_for_any_answer")
    only = parse_rewards("gcd=examples.my_reward:reward")
    assert only.for_task("chain_sum") is None and not only.empty
    assert parse_rewards("").empty and parse_rewards("").for_task("gcd") is None


@pytest.mark.parametrize("text, message", [
    ("examples.my_reward", r"tasks.rewards: 'examples.my_reward' is not module:function \(no ':'\)"),
    ("gcd=examples.my_reward", r"tasks.rewards: 'examples.my_reward' is not module:function"),
    ("examples/my_reward.py:reward", r"'examples/my_reward.py' in .* is not a dotted Python module name"),
    ("examples.my_reward:re-ward", r"'re-ward' in .* is not a Python function name"),
    ("gcd=a:b,gcd=c:d", r"task 'gcd' is listed twice"),
    ("a:b,c:d", r"two rewards without a task \('a:b' and 'c:d'\)"),
    ("=a:b", r"'=a:b' names no task"),
])
def test_bad_syntax_is_a_config_error_naming_the_key(text, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig.from_flat({"tasks.rewards": text})


@pytest.mark.parametrize("name, message", [
    ("examples.no_such_module:reward", r"tasks.rewards: module 'examples.no_such_module' of "
                                       r"'examples.no_such_module:reward' cannot be imported: No module named"),
    ("examples.my_reward:missing", r"tasks.rewards: module 'examples.my_reward' has no attribute 'missing'"),
    (f"{FIXTURES}:NOT_A_FUNCTION", rf"tasks.rewards: '{FIXTURES}:NOT_A_FUNCTION' is a float, not a callable"),
])
def test_names_that_do_not_import_stop_the_run_at_start_up(name, message):
    with pytest.raises(ConfigError, match=message):
        preflight.check({"tasks.rewards": f"gcd={name}"}, run_dir=False)


def test_a_reward_beside_the_package_imports_without_the_checkout_on_the_path(monkeypatch):
    """The `pubswap` command (and Flower's processes) may not have the checkout on sys.path: examples/ is found in
    the app's folder, beside pubswap_flwr/."""
    import sys

    from pubswap_flwr.tasks.rewards import PACKAGE_ROOT, load_reward

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(PACKAGE_ROOT))])
    for name in ("examples", "examples.my_reward"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    function = load_reward(RewardRef("examples.my_reward", "reward"))
    assert function("30", GCD) == pytest.approx(0.75)
    assert sys.path[-1] == str(PACKAGE_ROOT)


def test_the_server_refuses_a_bad_reward_before_any_round(tmp_path):
    from pubswap_flwr.simulation import simulate_in_process

    with pytest.raises(ConfigError, match="tasks.rewards: module 'examples.my_reward' has no attribute 'missing'"):
        simulate_in_process({"tasks.rewards": "examples.my_reward:missing", "output.dir": str(tmp_path),
                             "run-name": "bad"}, 2)
    assert not (tmp_path / "bad").exists()


def test_a_task_no_mix_lists_is_a_warning_only(caplog):
    flat = {"tasks.mix": "gcd:1,rg:countdown", "pubswap.public-mix": "rg:basic_arithmetic:2",
            "tasks.rewards": "gcd=examples.my_reward:reward,rg:countdown=examples.my_reward:reward,"
                             "rg:basic_arithmetic=examples.my_reward:reward,org=examples.my_reward:reward"}
    with caplog.at_level("WARNING", logger="pubswap_flwr.server.preflight"):
        preflight.check(flat, run_dir=False)
    assert [r.getMessage() for r in caplog.records] == [
        "tasks.rewards names task 'org', which no task mix of the run lists; it applies only to items of that task "
        "(a node's data file)"]


def test_reading_a_config_never_imports_the_reward():
    """from_flat checks syntax only (verify reads untrusted run directories with it)."""
    cfg = ExperimentConfig.from_flat({"tasks.rewards": "examples.no_such_module:reward"})
    assert cfg.tasks.rewards == "examples.no_such_module:reward"
    with pytest.raises(ConfigError, match="cannot be imported"):
        preflight.check_rewards(cfg)


# --- scoring in the worker -----------------------------------------------------------------------------------------

def test_the_example_reward_gives_partial_credit_in_the_scoring_worker():
    reward = RewardRef("examples.my_reward", "reward")
    assert score_completion("<answer>40</answer>", GCD, reward=reward).reward == 1.0
    assert score_completion("<answer>30</answer>", GCD, reward=reward).reward == pytest.approx(0.75)
    assert score_completion("<answer>forty</answer>", GCD, reward=reward).reward == 0.0
    assert score_completion("no tags, 40", GCD, reward=reward).reason == "no <answer>...</answer> in completion"
    # the built-in gcd verifier pays nothing for 30: the user's function did the scoring
    assert score_completion("<answer>30</answer>", GCD).reward == 0.0
    assert score_completion("<answer>1</answer>", GCD, reward=RewardRef(FIXTURES, "one_in_the_scoring_worker")
                            ).reward == 1.0


@pytest.mark.parametrize("function", ["sleeps_past_the_limit", "loops_forever"])
def test_a_reward_that_runs_past_the_limit_gets_zero_with_the_timeout_reason(function):
    score = score_completion("<answer>1</answer>", GCD, reward=RewardRef(FIXTURES, function), timeout_s=0.5)
    assert score.reward == 0.0 and score.timed_out
    assert score.reason == f"scoring timeout: ScoringTimeout: reward {FIXTURES}:{function} hit the 0.5 s timeout"
    # the worker goes on scoring
    assert score_completion("<answer>3</answer>", GCD, reward=RewardRef(FIXTURES, "half_for_any_answer")).reward == 0.5


def test_a_reward_that_raises_gets_zero_with_its_error():
    score = score_completion("<answer>1</answer>", GCD, reward=RewardRef(FIXTURES, "not_there"))
    assert score.reward == 0.0
    assert score.reason == (f"scorer error: RewardError: tasks.rewards: module '{FIXTURES}' has no attribute "
                            f"'not_there' (from '{FIXTURES}:not_there')")


def test_the_scoring_budget_of_the_server_and_of_sapo_receivers_applies_the_runs_rewards():
    """PubSwap's server re-verifies public responses and SAPO receivers re-score peers' completions through a
    ScoringBudget built with the run's tasks.rewards."""
    from pubswap_flwr.tasks import ScoringBudget

    budget = ScoringBudget(2.0, 10.0, rewards=parse_rewards(f"gcd={FIXTURES}:half_for_any_answer"))
    assert budget.score("node-1", "<answer>7</answer>", GCD).reward == 0.5
    chain = TaskItem("u/2", "chain_sum", "3 + 4 =", "7", "numeric")
    assert budget.score("node-1", "<answer>7</answer>", chain).reward == 1.0  # its own verifier
    assert budget.score("node-1", "<answer>8</answer>", chain).reward == 0.0
    assert budget.usage("node-1").scored == 3


def test_a_sapo_receiver_rescores_a_peers_completions_with_its_own_configured_reward(tmp_path):
    from pubswap_flwr.algorithms.sapo_selection import Packet
    from pubswap_flwr.node_runtime.learner import Learner, NodeSettings
    from pubswap_flwr.node_runtime.state import NodeIdentity
    from pubswap_flwr.protocols.sapo import SapoNode
    from pubswap_flwr.tasks import MixtureStream, StreamCursor

    cfg = ExperimentConfig.from_flat({"strategy.mode": "sapo", "tasks.mix": "gcd:1", "tasks.per-node": 0,
                                      "eval.items-per-task": 2, "sapo.completions": 4,
                                      "tasks.rewards": "examples.my_reward:reward"})
    node = Learner(NodeSettings.of(cfg), NodeIdentity(0, tmp_path / "node", "embedded:tiny"))
    spec = node.universe.tasks[0]
    item = MixtureStream([spec], node.universe.tasks, node=5, exclude=set()).take(1, StreamCursor())[0]
    # within 1% of the reference: examples.my_reward pays 1, the built-in gcd verifier less (0/1 training rewards)
    packet = Packet("peer", item, (f"<answer>{item.answer}.001</answer>", "<answer>forty</answer>"))
    assert SapoNode(node, cfg.sapo).rescore(packet) == [1.0, 0.0]
    assert SapoNode(replace_rewards(node, ""), cfg.sapo).rescore(packet) == [0.0, 0.0]


def replace_rewards(learner, text: str):
    """The same node with another tasks.rewards (the learner reads its table once)."""
    from pubswap_flwr.tasks.rewards import parse_rewards

    learner.rewards = parse_rewards(text)
    return learner


# --- a run --------------------------------------------------------------------------------------------------------

RUN = {"seed": 5, "num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
       "train.completions-per-prompt": 4, "eval.items-per-task": 4, "eval.samples": 2,
       "tasks.mix": "gcd:1,chain_sum:1", "tasks.per-node": 0, "tasks.partial-credit": True, "model.threads": 1,
       "tasks.rewards": f"gcd={FIXTURES}:half_for_any_answer,examples.my_reward:reward", "run-name": "own-reward",
       "strategy.apply-below-robust": True}  # 2 nodes: below the robust minimum (#54 class 4)


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    from pubswap_flwr.simulation import simulate_in_process

    out = tmp_path_factory.mktemp("runs")
    simulate_in_process({**RUN, "output.dir": str(out)}, 2)
    return out / "own-reward"


def test_a_run_evaluates_and_trains_with_the_users_reward(reward_run):
    from pubswap_flwr.server.metrics import read_metrics

    rows = read_metrics(reward_run)
    evals = [row["eval"] for row in rows if row.get("eval")]
    assert len(evals) == 2  # round 0 and round 1
    for result in evals:
        gcd, chain_sum = result["per_task"]["gcd"], result["per_task"]["chain_sum"]
        # half_for_any_answer pays 0.5 for every tagged answer (the tiny model tags all four) and never 1
        assert (gcd["greedy_reward"], gcd["greedy_accuracy"]) == (0.5, 0.0)
        assert gcd["sampled_accuracy"] == 0.0 and 0 < gcd["sampled_reward"] <= 0.5  # 0.5 per tagged sample
        assert gcd["sampled_reward"] * 16 == pytest.approx(round(gcd["sampled_reward"] * 16))
        # examples.my_reward (every other task) pays near misses partial credit: no multiple of 1/4 over 4 items,
        # which the built-in chain_sum verifier's 0/1 would give
        assert chain_sum["greedy_reward"] * 4 != pytest.approx(round(chain_sum["greedy_reward"] * 4))
    trained = [c for row in rows for c in (row.get("clients") or {}).values()]
    assert trained and all(c.get("status", "ok") == "ok" for c in trained)


def test_pubswap_ask_answers_greedily_as_transformers_and_peft_do(reward_run, capsys):
    import torch
    from peft import PeftModel

    from pubswap_flwr import cli
    from pubswap_flwr.policy.model import load_causal_lm, load_tokenizer, resolve_model
    from pubswap_flwr.results.ask import ask
    from pubswap_flwr.tasks import extract_answer

    question = "What is the GCD of 12 and 18?"
    prompt, answers = ask(reward_run, question)
    assert len(answers) == 1 and prompt.endswith("<|im_start|>assistant\n")
    assert "Reply with only the final answer as <answer>X</answer>." in prompt

    cfg = ExperimentConfig.from_flat(json.loads((reward_run / "config.json").read_text())["config"])
    location = resolve_model(cfg.model.name)
    tokenizer = load_tokenizer(location)
    model = PeftModel.from_pretrained(load_causal_lm(location, "float32", torch.device("cpu")),
                                      str(reward_run / "adapters" / "final")).eval()
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=cfg.generation.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert answers[0].completion == expected
    assert answers[0].answer == extract_answer(expected)

    assert cli.main(["ask", str(reward_run), question]) == 0
    printed = capsys.readouterr().out
    assert f"completion: {expected}\n" in printed
    assert cli.main(["ask", str(reward_run), question, "--greedy", "--samples", "2"]) == 2
    assert "--greedy and --samples exclude each other" in capsys.readouterr().err


def test_verify_imports_a_runs_reward_only_when_told(reward_run):
    from pubswap_flwr.results.verify import render, run_rewards, verify

    [without] = verify(reward_run, items_per_task=2, samples=1)
    assert "NOTE: the run used user rewards" in render([without])
    [imported] = verify(reward_run, items_per_task=2, samples=1, import_rewards=True)
    assert "NOTE: scored with the run's user rewards" in render([imported])
    mine, builtin = imported["verify"]["per_task"]["gcd"], without["verify"]["per_task"]["gcd"]
    assert (mine["greedy_reward"], mine["greedy_accuracy"]) == (0.5, 0.0)  # half_for_any_answer, imported
    assert builtin["greedy_reward"] == builtin["greedy_accuracy"]  # the built-in gcd verifier pays 0 or 1

    cfg = ExperimentConfig.from_flat(json.loads((reward_run / "config.json").read_text())["config"])
    table, note = run_rewards(cfg, import_rewards=False, run_dir=reward_run)
    assert table.empty
    assert note.startswith(f"the run used user rewards (tasks.rewards = {RUN['tasks.rewards']!r}); they are not "
                           "imported (pass --import-rewards")
    table, note = run_rewards(cfg, import_rewards=True, run_dir=reward_run)
    assert table.for_task("gcd") == RewardRef(FIXTURES, "half_for_any_answer")
    assert note.startswith("scored with the run's user rewards")
