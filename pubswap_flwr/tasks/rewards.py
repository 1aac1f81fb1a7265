"""User reward functions named in the run config (`tasks.rewards`): parsed, imported by name, and looked up per task.

A reward is a plain function `reward(answer: str, item: TaskItem) -> float` in [0, 1] (TRL's `reward_funcs`, one
completion at a time), named as "module:function". `tasks.rewards` is either one name for every task
("examples.my_reward:reward"), or comma-separated `task=module:function` entries, optionally with one bare name for
the tasks not listed ("gcd=examples.my_reward:reward,examples.other:score"). A task with a reward is scored by it
instead of its item's verifier everywhere the run scores: training rollouts, the server's re-verification of public
responses (pubswap), SAPO receivers' re-scoring and held-out evaluation.

Rewards in TRL's shape (`tasks.trl-rewards`, same syntax, a name may be a '+'-joined sum of functions) are
`f(prompts, completions, **columns) -> list[float | None]`, GRPOTrainer's reward_funcs unchanged: called once per group
of one item's completions with the whole completion texts, the user turn's text as each prompt (`trl_prompt`) and the
item's columns one list each (`trl_columns`); the values are checked (`trl_values`) and summed over the functions,
unclipped, and train a node's own rollouts only (verifiers.score_trl_group). None from every function: that
completion is scored as without them.

Parsing (`parse_rewards`) checks syntax only and never imports: it runs wherever a config is read, also on a run
directory `pubswap verify` was given. Importing happens at start-up in the processes that run the config
(preflight on the server, the learner on each node: `isolation.check_rewards`) so a bad name fails before any
training, and it happens in the isolated scoring worker (isolation.py), never in the caller: the caller finds the
folder the module would be imported from without running it (`import_root`), and the worker imports it from there
(`load_reward`) within REWARD_IMPORT_TIMEOUT_S, so a module that hangs at import stops start-up with a clear error
instead of hanging it. Scoring then runs in that worker, under the same soft and hard time limits as the built-ins.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import math
import numbers
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Generic, TypeVar

from ..schema import REWARD_BOUND
from .items import TaskItem
from .prompts import user_message
from .specs import TaskError

REWARDS_KEY = "tasks.rewards"
TRL_REWARDS_KEY = "tasks.trl-rewards"
TRL_REWARD_BOUND = REWARD_BOUND  # a TRL reward's value beyond +-this is refused (the run's metrics' bounds)
TRL_OWN_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state")  # never item columns
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout (or the installed app bundle): examples/ is here
REWARD_IMPORT_TIMEOUT_S = 30.0  # a reward module that takes longer to import in the scoring worker stops start-up


class RewardError(TaskError):
    """A reward name cannot be used: bad syntax, a module that does not import, a missing or non-callable function."""


@dataclass(frozen=True)
class RewardRef:
    """A user reward function named "module:function"."""

    module: str
    function: str

    @property
    def name(self) -> str:
        return f"{self.module}:{self.function}"


Entry = TypeVar("Entry")


@dataclass(frozen=True)
class _TaskTable(Generic[Entry]):
    """Which tasks an entry applies to: `per_task` entries first, else `default` (None: the item's own verifier)."""

    per_task: tuple[tuple[str, Entry], ...] = ()
    default: Entry | None = None

    @property
    def empty(self) -> bool:
        return not self.per_task and self.default is None

    def for_task(self, task: str) -> Entry | None:
        for name, entry in self.per_task:
            if name == task:
                return entry
        return self.default

    def entries(self) -> list[Entry]:
        """The entries as written, per-task ones first, repeats kept."""
        return [entry for _task, entry in self.per_task] + ([self.default] if self.default is not None else [])


class RewardTable(_TaskTable[RewardRef]):
    """Which tasks a user reward scores (`tasks.rewards`)."""

    def refs(self) -> list[RewardRef]:
        """Every reward named, each once, in the order written."""
        return list(dict.fromkeys(self.entries()))


@dataclass(frozen=True)
class TrlReward:
    """A task's reward in TRL's shape: the sum of these functions' values (TRL's reward_funcs, weights 1)."""

    refs: tuple[RewardRef, ...]

    @property
    def name(self) -> str:
        return "+".join(ref.name for ref in self.refs)


class TrlRewardTable(_TaskTable[TrlReward]):
    """Which tasks train on a TRL reward (`tasks.trl-rewards`)."""

    def refs(self) -> list[RewardRef]:
        """Every function named, each once, in the order written."""
        return list(dict.fromkeys(ref for reward in self.entries() for ref in reward.refs))


def parse_reward_name(text: str, key: str = REWARDS_KEY) -> RewardRef:
    """"package.module:function" as a RewardRef; RewardError naming `key` and what is wrong (syntax only)."""
    module, colon, function = text.strip().partition(":")
    if not colon:
        raise RewardError(f"{key}: {text.strip()!r} is not module:function (no ':'), e.g. examples.my_reward:reward")
    if not _MODULE.fullmatch(module.strip()):
        raise RewardError(f"{key}: {module.strip()!r} in {text.strip()!r} is not a dotted Python module name")
    if not _FUNCTION.fullmatch(function.strip()):
        raise RewardError(f"{key}: {function.strip()!r} in {text.strip()!r} is not a Python function name")
    return RewardRef(module.strip(), function.strip())


def _entries(text: str, key: str) -> tuple[list[tuple[str, str]], str | None]:
    """The comma-separated `task=value` entries of `text` and its one bare value (None: none); RewardError naming
    `key` for an entry without a task, a task listed twice or two bare values."""
    per_task: list[tuple[str, str]] = []
    default: str | None = None
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        task, equals, value = part.partition("=")
        if not equals:
            if default is not None:
                raise RewardError(f"{key}: two rewards without a task ({default!r} and {part!r}); name the task "
                                  "of all but one as task=module:function")
            default = part
            continue
        task = task.strip()
        if not task:
            raise RewardError(f"{key}: {part!r} names no task before '='")
        if any(task == seen for seen, _value in per_task):
            raise RewardError(f"{key}: task {task!r} is listed twice")
        per_task.append((task, value))
    return per_task, default


@lru_cache(maxsize=64)
def parse_rewards(text: str, key: str = REWARDS_KEY) -> RewardTable:
    """`tasks.rewards` as a RewardTable (module docstring for the syntax); '' is the empty table. Never imports."""
    per_task, default = _entries(text, key)
    return RewardTable(tuple((task, parse_reward_name(name, key)) for task, name in per_task),
                       None if default is None else parse_reward_name(default, key))


def _trl_sum(text: str, key: str, entry: str) -> TrlReward:
    names = text.split("+")
    if any(not name.strip() for name in names):
        raise RewardError(f"{key}: {entry!r} has an empty name in its sum (module:function+module:function)")
    return TrlReward(tuple(parse_reward_name(name, key) for name in names))


@lru_cache(maxsize=64)
def parse_trl_rewards(text: str, key: str = TRL_REWARDS_KEY) -> TrlRewardTable:
    """`tasks.trl-rewards` as a TrlRewardTable: `tasks.rewards`' syntax, each name possibly a '+'-joined sum of
    functions ("gcd=examples.trl_reward:reward_len+examples.trl_reward:format_reward"); '' is the empty table.
    Never imports."""
    per_task, default = _entries(text, key)
    return TrlRewardTable(tuple((task, _trl_sum(value, key, f"{task}={value}")) for task, value in per_task),
                          None if default is None else _trl_sum(default, key, default))


def trl_prompt(item: TaskItem) -> str:
    """The prompt a TRL reward gets for `item`: the text of the user turn the model answered (the question and the
    instruction of its family), without the chat template's markup."""
    return user_message(item.question, item.family)


def trl_columns(item: TaskItem, count: int) -> dict[str, list]:
    """The keyword arguments a TRL reward gets for `count` completions of `item`: one list per column, as TRL
    repeats a dataset's columns per completion: the item's metadata fields, then question, answer, task and uid
    (which win over metadata fields of those names); names TRL passes itself are left out."""
    columns = {name: value for name, value in item.metadata.items() if name not in TRL_OWN_ARGUMENTS}
    columns.update(question=item.question, answer=item.answer, task=item.task, uid=item.uid)
    return {name: [value] * count for name, value in columns.items()}


def trl_values(values: object, count: int, name: str, key: str = TRL_REWARDS_KEY) -> list[float | None]:
    """A TRL reward's reply for `count` completions as floats (None kept); RewardError naming `key` and the
    function `name` when it is not a list of `count` entries each None or a finite number within TRL_REWARD_BOUND."""
    if not isinstance(values, (list, tuple)):
        raise RewardError(f"{key}: {name} returned a {type(values).__name__}, not a list of rewards (one per "
                          "completion)")
    if len(values) != count:
        raise RewardError(f"{key}: {name} returned {len(values)} rewards for {count} completions")
    out: list[float | None] = []
    for index, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RewardError(f"{key}: {name} returned {value!r} for completion {index}, not a number or None")
        number = float(value)
        if not (math.isfinite(number) and abs(number) <= TRL_REWARD_BOUND):
            raise RewardError(f"{key}: {name} returned {number:g} for completion {index}, not a finite number in "
                              f"[{-TRL_REWARD_BOUND:g}, {TRL_REWARD_BOUND:g}]")
        out.append(number)
    return out


def load_reward(ref: RewardRef, key: str = REWARDS_KEY) -> Callable:
    """The function `ref` names, imported (Python's path, then the app's folder, PACKAGE_ROOT); RewardError naming
    `key` when the module does not import or the attribute is missing or not callable."""
    try:
        module = _import(ref.module)
    except ImportError as err:
        raise RewardError(f"{key}: module {ref.module!r} of {ref.name!r} cannot be imported: {err}") from None
    if not hasattr(module, ref.function):
        raise RewardError(f"{key}: module {ref.module!r} has no attribute {ref.function!r} (from {ref.name!r})")
    function = getattr(module, ref.function)
    if not callable(function):
        raise RewardError(f"{key}: {ref.name!r} is a {type(function).__name__}, not a callable")
    return function


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing_itself = bool(err.name) and (module == err.name or module.startswith(f"{err.name}."))
        if not missing_itself or str(PACKAGE_ROOT) in sys.path:
            raise  # the module was found but imports something missing, or the app's folder was searched already
    sys.path.append(str(PACKAGE_ROOT))  # the app's folder, where Flower's bundle puts examples/ beside the package
    return importlib.import_module(module)


@lru_cache(maxsize=64)
def import_root(ref: RewardRef) -> str | None:
    """The sys.path folder `ref`'s module would be imported from (Python's path, then PACKAGE_ROOT, as `_import`
    searches), found without running any of its code; None when neither holds it (the worker's import then says
    why)."""
    top = ref.module.partition(".")[0]
    loaded = sys.modules.get(top)
    spec = loaded.__spec__ if loaded is not None else None
    for search in ([] if spec is not None else [None, [str(PACKAGE_ROOT)]]):
        spec = importlib.machinery.PathFinder.find_spec(top, search)
        if spec is not None:
            break
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the folder above it
        return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)
    if spec.origin and spec.has_location:  # a top-level module file
        return str(Path(spec.origin).resolve().parent)
    return None  # built in or frozen: no folder to import it from
