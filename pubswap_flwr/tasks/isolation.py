"""Isolated scoring: runs the scorers that can blow up in a killable worker process under a hard time limit.

Why a process. Some scorers do unbounded work on model or peer text: the sympy-based reasoning-gym scorers
(countdown, puzzle24, polynomial_multiplication, simple/intermediate_integration) spend minutes on `9**9**9` or on
simplifying the derivative of a large product, and such work can sit in C (big-integer arithmetic, the regex
engine), where no thread can interrupt it. `score_completion` therefore sends them to an `IsolatedScorer`: one
long-lived worker process (`_score_worker.py`, a `workers.WorkerProcess`) that runs the same scorer code as the
caller would, with two bounds per completion, as the math checker has:

* soft: the worker arms a signal timer of `timeout_s` around the scorer; when it fires (Python-level work, which is
  most sympy work) the answer is "timeout" and the worker stays up;
* hard: the caller waits at most `timeout_s + grace_s` for the reply, then kills the worker and starts a replacement
  at once (it imports while the caller goes on; the next isolated score waits for it to be ready).

Either way the caller gets a `ScoringTimeout` within the hard bound, from any thread, and `score_completion` turns it
into reward 0 with a reason starting "scoring timeout: " (`Score.timed_out`). Nothing is cached, so a timeout is
never remembered as a failure. Time spent starting a worker (about 1 s of imports) is not charged to a completion.

What runs where (`verifiers.scored_in_worker`), decided by measurement (`benchmarks/scoring.py`, 2 CPU cores): a
pipe round trip with the item as JSON costs about 0.1-0.3 ms, while the cheap scorers take about 5 us, so sending
every completion to the worker would make ordinary scoring about 20 times slower (gcd: 0.004 ms in the caller, 0.09
ms through the worker). Batching completions per worker call would cut that but not remove it, and would make one
slow completion's kill cost its batch. So only scorers that can blow up go to the worker: every reasoning-gym
generator except an allowlist whose scoring was read and is cheap, linear-time Python on text bounded by `max_chars`
(`verifiers.INLINE_RG_GENERATORS`: the preset tasks and the literal-based safe replacements). Unknown or new
reasoning-gym generators (`rg:<name>`) are isolated by default. `exact`, `numeric` and `mc` run in the caller: they
are linear-time string code (every regex in the package is tested on adversarial text). `math` runs math-verify in
its own worker (`math_answers.MathChecker`) with the same soft/hard bounds and the completion's remaining budget.
Measured medians against the old direct call: scorers in the caller 1.15x (about 1 us of bookkeeping on 5-10 us);
isolated sympy scorers, 0.5-8 ms of work each, 1.2x; math unchanged. On the adversarial corpus every completion
finished within its limit (2.02 s worst with timeout_s=2).

Checks are serialized per scorer (a lock): one worker per process; a thread waiting for the lock is not charged for
the wait by the time limit, which bounds the scorer's own time.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from pathlib import Path

from .items import TaskItem
from .workers import ScoringTimeout, WorkerProcess

log = logging.getLogger(__name__)

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


_LIVE: "weakref.WeakSet[IsolatedScorer]" = weakref.WeakSet()


class IsolatedScorer:
    """Runs a registered scorer on (answer, item) in a worker process, with soft and hard timeouts (module
    docstring). `soft_timeout=False` leaves only the hard deadline (tests of the kill path)."""

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S, soft_timeout: bool = True):
        self.grace_s = float(grace_s)
        self.memory_mb = int(memory_mb)
        self.startup_timeout_s = float(startup_timeout_s)
        self.soft_timeout = soft_timeout
        self.restarts = 0  # workers killed at the hard deadline or found dead
        self.timeouts = 0  # soft and hard timeouts together
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._next_id = 0
        _LIVE.add(self)

    def _spawn(self) -> WorkerProcess:
        env = dict(os.environ)
        for name in _ONE_THREAD:
            env.setdefault(name, "1")
        return WorkerProcess([sys.executable, str(WORKER_SCRIPT), "--package-root", str(PACKAGE_ROOT),
                              "--memory-mb", str(self.memory_mb)], name="scoring worker", env=env)

    def _ready_worker(self) -> WorkerProcess:
        if self._worker is not None and not self._worker.alive:
            log.warning("scoring worker exited (code %s); restarting", self._worker.process.poll())
            self._worker.stop()
            self._worker = None
            self.restarts += 1
        if self._worker is None:
            self._worker = self._spawn()
        try:
            self._worker.wait_ready(self.startup_timeout_s)
        except RuntimeError:
            self._worker = None
            raise
        return self._worker

    def _kill(self, worker: WorkerProcess) -> None:
        """Stop `worker` and start its replacement now, so its imports overlap the caller's other work."""
        worker.stop()
        self.restarts += 1
        if self._worker is worker:
            self._worker = None
            try:
                self._worker = self._spawn()
            except OSError as err:  # cannot fork now: the next score tries again
                log.warning("could not start a replacement scoring worker: %s", err)

    def score(self, answer: str, item: TaskItem, timeout_s: float) -> float:
        """The reward `item.verifier`'s scorer gives `answer`, computed in the worker.

        Raises ScoringTimeout when it does not finish within `timeout_s` (soft) or `timeout_s + grace_s` (hard; the
        worker is killed), RemoteScorerError when the scorer raised, RuntimeError when the worker cannot start or
        dies during the check.
        """
        label = _label(item)
        if timeout_s <= 0:
            self.timeouts += 1
            raise ScoringTimeout(f"{label}: no time left in the scoring budget")
        with self._lock:
            worker = self._ready_worker()
            self._next_id += 1
            request_id = self._next_id
            request = {"id": request_id, "verifier": item.verifier, "answer": answer, "item": item.to_dict(),
                       "timeout_s": timeout_s if self.soft_timeout else 0}
            try:
                worker.send(request)
            except OSError as err:  # broken pipe: the worker died between checks
                self._kill(worker)
                raise RuntimeError(f"scoring worker pipe failed: {err}") from err
            hard_s = timeout_s + self.grace_s
            deadline = time.monotonic() + hard_s
            while True:
                reply = worker.read(deadline)
                if reply is None:
                    died = not worker.alive
                    self._kill(worker)
                    if died:
                        raise RuntimeError(f"scoring worker exited (code {worker.process.poll()}) during a check")
                    self.timeouts += 1
                    raise ScoringTimeout(f"{label} hit the {hard_s:g} s hard timeout; worker killed")
                if reply.get("id") == request_id:
                    break
        if "reward" in reply:
            return float(reply["reward"])
        if reply.get("error") == "timeout":
            self.timeouts += 1
            raise ScoringTimeout(f"{label} {reply.get('message')}")
        raise RemoteScorerError(str(reply.get("type") or "Error"), str(reply.get("message")))

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None


@atexit.register
def _close_all() -> None:
    for scorer in list(_LIVE):
        scorer.close()


_default: IsolatedScorer | None = None
_default_lock = threading.Lock()


def default_isolated_scorer() -> IsolatedScorer:
    """The isolated scorer `score_completion` uses (created on first use; its worker starts on first score)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = IsolatedScorer()
        return _default


def set_default_isolated_scorer(scorer: IsolatedScorer | None) -> IsolatedScorer | None:
    """Replace `score_completion`'s isolated scorer (None: a default one on next use); returns the previous one (not
    closed)."""
    global _default
    with _default_lock:
        previous, _default = _default, scorer
        return previous
