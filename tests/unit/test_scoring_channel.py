"""The scoring worker's boundary (#54, classes 1 and 3): replies travel on a private channel that a reward and its
children cannot write to, a reply that does not match its request is refused, the reward's output is captured and
bounded, a reward's children die with the worker, a restart is charged to the completion that caused it, and a
reward module is imported under a time limit at start-up."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubswap_flwr.config import ConfigError, ExperimentConfig
from pubswap_flwr.server import preflight
from pubswap_flwr.tasks import TaskItem, score_completion
from pubswap_flwr.tasks.budget import ScoringBudget
from pubswap_flwr.tasks.isolation import IsolatedScorer, set_default_isolated_scorer
from pubswap_flwr.tasks.rewards import RewardError, RewardRef, RewardTable
from pubswap_flwr.tasks.workers import BadReply, parse_reply

FIXTURES = "tests.unit.reward_fixtures"
GCD = TaskItem("u/1", "gcd", "What is the GCD of 12 and 40?", "40", "rg", provenance={"generator": "gcd"})
WRONG = "<answer>7</answer>"


def reward(function: str) -> RewardRef:
    return RewardRef(FIXTURES, function)


@pytest.fixture
def scorer():
    """A fresh isolated scorer, made score_completion's, and started outside any timing."""
    fresh = IsolatedScorer(grace_s=0.5)
    previous = set_default_isolated_scorer(fresh)
    assert score_completion(WRONG, GCD, reward=reward("zero_for_any_answer")).reward == 0.0
    yield fresh
    set_default_isolated_scorer(previous)
    fresh.close()


# --- class 1: rewards forged through the scoring worker's output channel --------------------------------------------

def test_forged_reward_lines_on_stdout_do_not_become_later_rewards(scorer):
    """Before: the worker answered on fd 1, so the forged lines (ids 1-100, reward 1.0) were read as the replies to
    the next requests and 5 wrong answers scored 1.0."""
    assert score_completion(WRONG, GCD, reward=reward("prints_forged_replies")).reward == 0.0
    for _ in range(5):
        score = score_completion(WRONG, GCD, reward=reward("zero_for_any_answer"))
        assert (score.reward, score.reason) == (0.0, None)
    assert score_completion("<answer>40</answer>", GCD, reward=RewardRef("examples.my_reward", "reward")).reward == 1.0


def test_forged_reward_a_reply_that_does_not_match_its_request_is_refused(scorer, caplog):
    score = score_completion(WRONG, GCD, reward=reward("replies_on_the_worker_channel"))
    assert score.reward == 0.0
    assert "does not match the request" in score.reason
    assert scorer.restarts == 1  # the worker that sent it is replaced
    assert score_completion("<answer>3</answer>", GCD, reward=reward("half_for_any_answer")).reward == 0.5


def test_forged_reward_the_rewards_output_is_captured_and_bounded(scorer):
    score = score_completion(WRONG, GCD, reward=reward("prints_a_lot"))
    assert score.reward == 0.25
    deadline = time.monotonic() + 30  # the capture thread may still be reading when the reply is in
    while not (tail := scorer.output_tail()) or tail[-1] != "y" or len(tail) < 200:
        assert time.monotonic() < deadline, tail[-3:]
        time.sleep(0.1)
    assert len(tail) == 200 and set(tail) == {"y"}  # the last lines, each kept; 5 MB of "x" before them dropped
    assert sum(len(line) for line in tail) <= 64 * 1024


# --- class 3: a child process breaks the time limit; restarts; a reward module that hangs at import -----------------

def test_child_process_left_running_does_not_stall_the_next_hard_timeout(tmp_path, monkeypatch):
    """Before: the child held the worker's reply pipe open, so the kill at the next hard limit waited for it (60 s)."""
    pid_file = tmp_path / "child.pid"
    monkeypatch.setenv("PUBSWAP_TEST_CHILD_PID_FILE", str(pid_file))
    hard = IsolatedScorer(grace_s=0.5, soft_timeout=False)
    previous = set_default_isolated_scorer(hard)
    try:
        assert score_completion(WRONG, GCD, reward=reward("leaves_a_child_running")).reward == 0.0
        child = int(pid_file.read_text())
        start = time.monotonic()
        score = score_completion(WRONG, GCD, reward=reward("loops_forever"), timeout_s=0.5)
        took = time.monotonic() - start
        assert score.timed_out and "hard timeout" in score.reason
        assert took < 20.0  # the worker's restart is in it (a few seconds); the stall was 60 s
        assert not _alive(child)  # killed with the worker's process group
    finally:
        set_default_isolated_scorer(previous)
        hard.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie child of an exited worker is dead too
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_child_process_restart_after_a_reward_exits_is_charged_to_its_sender(scorer):
    """Before: the worker's death returned at once and the replacement's start (6-10 s) was charged to whoever scored
    next; now the completion that killed the worker waits for its replacement."""
    budget = ScoringBudget(seconds_per_completion=2.0, seconds_per_sender=60.0,
                           rewards=RewardTable(per_task=(("gcd", reward("exits_the_worker")),)))
    honest = ScoringBudget(seconds_per_completion=2.0, seconds_per_sender=60.0,
                           rewards=RewardTable(per_task=(("gcd", reward("zero_for_any_answer")),)))
    score = budget.score("crasher", WRONG, GCD)
    assert score.reward == 0.0 and "exited" in score.reason
    assert scorer.restarts == 1
    start = time.monotonic()
    assert honest.score("honest", WRONG, GCD).reward == 0.0
    honest_s = time.monotonic() - start
    assert budget.usage("crasher").seconds > honest_s  # the restart was the crasher's, not the next sender's


def test_reward_module_that_hangs_at_import_fails_start_up_within_its_limit(monkeypatch):
    monkeypatch.setattr("pubswap_flwr.tasks.rewards.REWARD_IMPORT_TIMEOUT_S", 2.0)
    cfg = ExperimentConfig.from_flat({"tasks.rewards": "tests.unit.reward_hangs_at_import:reward"})
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"reward_hangs_at_import.*did not import within 2 s"):
        preflight.check_rewards(cfg)
    assert time.monotonic() - start < 30.0  # the worker's start (imports) plus the 2 s limit; before: for ever
    assert "tests.unit.reward_hangs_at_import" not in __import__("sys").modules  # never imported in this process


def test_reward_module_import_errors_still_name_the_key():
    from pubswap_flwr.tasks.isolation import check_rewards

    with pytest.raises(RewardError, match=r"tasks.rewards: module 'tests.unit.nothing_here' of "
                                          r"'tests.unit.nothing_here:reward' cannot be imported"):
        check_rewards(RewardTable(default=RewardRef("tests.unit.nothing_here", "reward")))
    with pytest.raises(RewardError, match=r"NOT_A_FUNCTION' is a float, not a callable"):
        check_rewards(RewardTable(default=reward("NOT_A_FUNCTION")))


# --- properties: any bytes on the scoring channel --------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_on_the_reply_channel_read_as_an_object_or_are_refused(line):
    try:
        reply = parse_reply(line, "scoring worker")
    except BadReply as err:
        assert str(err).startswith("scoring worker wrote a reply that is not a JSON object")
    else:
        assert isinstance(reply, dict)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channel=st.sampled_from(["out", "err"]), data=st.binary(max_size=4000) | st.just(b'{"id": 1, "reward": 1}\n'))
def test_any_bytes_a_reward_prints_never_become_a_reward(scorer, channel, data):
    printed = score_completion(f"<answer>{channel}:{data.hex()}</answer>", GCD,
                               reward=reward("writes_the_bytes_its_answer_names"), max_chars=20_000)
    assert printed.reward == 0.0
    assert score_completion(WRONG, GCD, reward=reward("zero_for_any_answer")).reward == 0.0
    assert score_completion(WRONG, GCD, reward=reward("half_for_any_answer")).reward == 0.5
    assert scorer.restarts == 0


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=200))
def test_any_bytes_on_the_reply_channel_itself_never_score(scorer, data):
    """Bytes a reward writes onto the worker's own channel (only code running in the worker can) corrupt or
    precede its reply: it is refused, and the next answer is scored right by a replacement."""
    forged = score_completion(f"<answer>reply:{data.hex()}</answer>", GCD,
                              reward=reward("writes_the_bytes_its_answer_names"))
    assert forged.reward == 0.0
    assert score_completion(WRONG, GCD, reward=reward("half_for_any_answer")).reward == 0.5
