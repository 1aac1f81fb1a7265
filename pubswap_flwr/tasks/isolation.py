"""Isolated scoring: runs the scorers that can blow up in a killable worker process under a hard time limit.

Why a process. Some scorers do unbounded work on model or peer text: the sympy-based reasoning-gym scorers
(countdown, puzzle24, polynomial_multiplication, simple/intermediate_integration) spend minutes on `9**9**9` or on
simplifying the derivative of a large product, and such work can sit in C (big-integer arithmetic, the regex
engine), where no thread can interrupt it. `score_completion` therefore sends them to an `IsolatedScorer`: one
long-lived worker process (`_score_worker.py`) that runs the same scorer code as the caller would, with two bounds
per completion; the process handling on both sides is shared with the math checker (`workers.WorkerClient`,
`_worker_loop.py`):

* soft: the worker arms a signal timer of `timeout_s` around the scorer; when it fires (Python-level work, which is
  most sympy work) the answer is "timeout" and the worker stays up;
* hard: the caller waits at most `timeout_s + grace_s` for the reply, then kills the worker (its whole process group)
  and starts a replacement, waiting for it within the same call.

Either way the caller gets a `ScoringTimeout` within the hard bound, from any thread, and `score_completion` turns it
into reward 0 with a reason starting "scoring timeout: " (`Score.timed_out`). Nothing is cached, so a timeout is
never remembered as a failure. The worker's first start (a few seconds of imports) is not charged to a completion;
a restart is charged to the completion that made it necessary (killed at the hard bound, crashed or exited the
worker, or a reply that does not match the request), so a `ScoringBudget` bills it to that completion's sender.
Replies come on a private channel that a scorer and its children cannot write to; what they print is captured and
bounded (workers.py).

What runs where (`reasoning_gym_scoring.scored_in_worker`), decided by measurement (`benchmarks/scoring.py`, 2 CPU
cores): a pipe round trip with the item as JSON costs about 0.1-0.3 ms, while the cheap scorers take about 5 us, so
sending every completion to the worker would make ordinary scoring about 20 times slower (gcd: 0.004 ms in the caller,
0.09 ms through the worker). Batching completions per worker call would cut that but not remove it, and would make one
slow completion's kill cost its batch. So only scorers that can blow up go to the worker: every reasoning-gym
generator except an allowlist whose scoring was read and is cheap, linear-time Python on text bounded by `max_chars`
(`reasoning_gym_scoring.INLINE_RG_GENERATORS`: the preset tasks and the literal-based safe replacements). Unknown or new
reasoning-gym generators (`rg:<name>`) are isolated by default. `exact`, `numeric` and `mc` run in the caller: they
are linear-time string code (every regex in the package is tested on adversarial text). `math` runs math-verify in
its own worker (`math_answers.MathChecker`) with the same soft/hard bounds and the completion's remaining budget.
Measured medians against the old direct call: scorers in the caller 1.15x (about 1 us of bookkeeping on 5-10 us);
isolated sympy scorers, 0.5-8 ms of work each, 1.2x; math unchanged. On the adversarial corpus every completion
finished within its limit (2.02 s worst with timeout_s=2).

User rewards (`tasks.rewards`, rewards.py) always run in this worker: the worker imports the function by its
"module:function" name (never pickled code), from the folder the caller imported it from, and keeps it for later
requests; an endless loop in it costs its completion reward 0 with a "scoring timeout: " reason, as for a built-in.
The run's reward names are checked at start-up by importing them in the worker too (`check_rewards`, under
`rewards.REWARD_IMPORT_TIMEOUT_S`), so a module that hangs or crashes at import cannot hang the caller's start-up;
the caller finds the folder it would import from without running the module (`rewards.import_root`). Functions in
TRL's shape (`tasks.trl-rewards`) run there the same way, once per group of completions under one time limit for the
group (`IsolatedScorer.score_trl`).

Checks are serialized per scorer (a lock): one worker per process; a thread waiting for the lock is not charged for
the wait by the time limit, which bounds the scorer's own time.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import rewards
from .items import TaskItem
from .rewards import (
    REWARDS_KEY,
    RewardError,
    RewardRef,
    RewardTable,
    TrlReward,
    TrlRewardTable,
    import_root,
    trl_values,
)
from .workers import LazyDefault, ScoringTimeout, WorkerClient

WORKER_SCRIPT = Path(__file__).with_name("_score_worker.py")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding pubswap_flwr/, for the worker's sys.path
DEFAULT_GRACE_S = 1.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_STARTUP_TIMEOUT_S = 120.0
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # scorers are serial; fewer threads
                                                                               # also keep the address space small


class RemoteScorerError(Exception):
    """The scorer raised in the worker; `type_name` is its exception's class name (the reason names it)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


def _label(item: TaskItem) -> str:
    if item.verifier == "rg":
        return f"{item.provenance.get('generator')} scorer"
    return f"{item.verifier} scorer"


class IsolatedScorer(WorkerClient):
    """Runs a registered scorer on (answer, item) in a worker process, with soft and hard timeouts (module
    docstring; the worker handling is `workers.WorkerClient`'s). `soft_timeout=False` leaves only the hard deadline
    (tests of the kill path)."""

    script = WORKER_SCRIPT
    name = "scoring worker"

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, soft_timeout: bool = True):
        super().__init__(grace_s=grace_s, memory_mb=memory_mb, startup_timeout_s=startup_timeout_s,
                         soft_timeout=soft_timeout)
        self.timeouts = 0  # soft and hard timeouts together

    def _arguments(self) -> list[str]:
        return ["--package-root", str(PACKAGE_ROOT)]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in _ONE_THREAD:
            env.setdefault(name, "1")
        return env

    def score(self, answer: str, item: TaskItem, timeout_s: float) -> float:
        """The reward `item.verifier`'s scorer gives `answer`, computed in the worker.

        Raises ScoringTimeout when it does not finish within `timeout_s` (soft) or `timeout_s + grace_s` (hard; the
        worker is killed), RemoteScorerError when the scorer raised, RuntimeError when the worker cannot start or
        dies during the check.
        """
        return self._score({"verifier": item.verifier, "answer": answer, "item": item.to_dict()}, _label(item),
                           timeout_s)

    def score_reward(self, reward: RewardRef, answer: str, item: TaskItem, timeout_s: float) -> float:
        """The reward the user function `reward` (tasks.rewards) gives `answer`, computed in the worker, which
        imports it by name from the folder this process found it in; raises as `score` does (an import failure in
        the worker is a RemoteScorerError)."""
        return self._score({"verifier": item.verifier, "reward": _spec(reward), "answer": answer,
                            "item": item.to_dict()}, f"reward {reward.name}", timeout_s)

    def check_reward(self, reward: RewardRef, timeout_s: float, key: str = REWARDS_KEY) -> None:
        """Import `reward` in the worker under `timeout_s` (the worker keeps it for scoring); RewardError naming
        `key` when it does not import in time, does not import, or is not a callable."""
        late = RewardError(f"{key}: module {reward.module!r} of {reward.name!r} did not import within {timeout_s:g} "
                           "s (imported in the scoring worker, which was stopped)")
        with self._lock:
            reply = self._request({"check_reward": _spec(reward), "key": key}, timeout_s)
        if reply is None or reply.get("error") == "timeout":
            raise late
        if reply.get("error"):
            raise RewardError(str(reply.get("message")))

    def score_trl(self, reward: TrlReward, prompts: list[str], completions: list[str], columns: dict,
                  timeout_s: float) -> list[list[float | None]]:
        """Each function of the TRL reward `reward` (tasks.trl-rewards) called once on the whole batch in the worker,
        under one time limit for the batch: per function, one value or None per completion (checked again here:
        `rewards.trl_values`, a RemoteScorerError RewardError when the reply is not that). Raises as `score`
        does."""
        label = f"reward {reward.name}"
        reply = self._reply({"trl_reward": [_spec(ref) for ref in reward.refs], "prompts": prompts,
                             "completions": completions, "columns": columns}, label, timeout_s, "rewards")
        values = reply["rewards"]
        if not isinstance(values, list) or len(values) != len(reward.refs):
            raise RemoteScorerError("BadReply", f"{label}: the worker sent {values!r:.200}, not one list per function")
        try:
            return [trl_values(row, len(completions), ref.name) for ref, row in zip(reward.refs, values)]
        except RewardError as err:
            raise RemoteScorerError("RewardError", str(err)) from None

    def _score(self, request: dict, label: str, timeout_s: float) -> float:
        value = self._reply(request, label, timeout_s, "reward")["reward"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RemoteScorerError("BadReply", f"{label} returned {value!r}, not a number")
        return float(value)

    def _reply(self, request: dict, label: str, timeout_s: float, field: str) -> dict:
        """The worker's reply holding `field`; ScoringTimeout or RemoteScorerError otherwise (as `score`)."""
        if timeout_s <= 0:
            self.timeouts += 1
            raise ScoringTimeout(f"{label}: no time left in the scoring budget")
        with self._lock:
            reply = self._request(request, timeout_s)
            if reply is None:
                self.timeouts += 1
                raise ScoringTimeout(f"{label} hit the {timeout_s + self.grace_s:g} s hard timeout; worker killed")
        if field in reply:
            return reply
        if reply.get("error") == "timeout":
            self.timeouts += 1
            raise ScoringTimeout(f"{label} {reply.get('message')}")
        raise RemoteScorerError(str(reply.get("type") or "Error"), str(reply.get("message")))


def _spec(reward: RewardRef) -> dict:
    """How the worker finds `reward`: its names and the folder this process would import its module from."""
    return {"module": reward.module, "function": reward.function, "root": import_root(reward)}


def check_rewards(table: RewardTable | TrlRewardTable, key: str = REWARDS_KEY, timeout_s: float | None = None) -> None:
    """Import every function `table` names in the scoring worker, each under `timeout_s` (default
    rewards.REWARD_IMPORT_TIMEOUT_S); RewardError (naming `key`) on the first that cannot be used. Nothing is imported
    here."""
    limit = rewards.REWARD_IMPORT_TIMEOUT_S if timeout_s is None else timeout_s
    for ref in table.refs():
        default_isolated_scorer().check_reward(ref, limit, key)


_default: LazyDefault[IsolatedScorer] = LazyDefault(IsolatedScorer)


def default_isolated_scorer() -> IsolatedScorer:
    """The isolated scorer `score_completion` uses (created on first use; its worker starts on first score)."""
    return _default.get()


def set_default_isolated_scorer(scorer: IsolatedScorer | None) -> IsolatedScorer | None:
    """Replace `score_completion`'s isolated scorer (None: a default one on next use); returns the previous one (not
    closed)."""
    return _default.replace(scorer)
