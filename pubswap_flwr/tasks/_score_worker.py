"""Scoring worker process: runs scorers that can blow up on requests read from stdin, one JSON reply line each.

Run as a script by `isolation.IsolatedScorer` (never imported by the package); the loop, the signal timer and the
memory cap are `_worker_loop.py`'s, shared with the math worker. It imports this package's verifiers (the same code
that scores in the caller's process: the safe reasoning-gym replacements, the sympy guard), so rewards are the same
as in-process scoring. Each request is {"id", "verifier", "answer", "item", "timeout_s"} with `item` a
`TaskItem.to_dict()`, and for a user reward (tasks.rewards) also "reward": {"module", "function", "root"}: the
function is imported by that name from `root` (the folder the caller imported it from) and run instead of the
verifier (the root is null when the caller found no folder for it: the worker's own path is searched); a request
{"id", "check_reward": {...}, "key", "timeout_s"} only imports such a function (the run's start-up check) and
replies {"id", "checked": true}. A request {"id", "trl_reward": [{"module", "function", "root"}, ...], "prompts",
"completions", "columns", "timeout_s"} calls each function in TRL's shape (tasks.trl-rewards) once on the whole batch
and replies {"id", "rewards": [[float | null per completion] per function]}, each list checked here first
(`rewards.trl_values`). The reply is {"id", "reward": float} or {"id", "error", "type", "message"}
where error is "timeout" or "exception" (`type` names the exception the scorer raised, so the caller's reason reads
as it would in-process). Some reasoning-gym scorers use a bare `except:` that would turn the timer's exception into
reward 0; the loop answers "timeout" for any request during which the timer fired.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _worker_loop  # noqa: E402 - importing it takes this folder off sys.path again


def add_arguments(parser):
    parser.add_argument("--package-root", required=True, help="folder holding the pubswap_flwr package")


def setup(args) -> _worker_loop.Handler:
    sys.path.insert(0, args.package_root)
    import pubswap_flwr.tasks  # noqa: F401 - registers every verifier, as in the caller's process
    from pubswap_flwr.tasks.items import TaskItem
    from pubswap_flwr.tasks.rewards import REWARDS_KEY, TRL_REWARDS_KEY, RewardRef, load_reward, trl_values
    from pubswap_flwr.tasks.verifiers import VERIFIERS

    # isort: split
    import reasoning_gym  # noqa: F401 - imported now so that the first request does not pay for it
    import sympy  # noqa: F401

    user_rewards: dict[tuple[str, str, str], object] = {}

    def user_reward(spec: dict, key: str = REWARDS_KEY):
        """A tasks.rewards function, imported by name from the folder the caller found it in (kept for reuse);
        RewardError (with the caller's wording, naming `key`) when it cannot be used."""
        module, function, root = str(spec["module"]), str(spec["function"]), spec["root"]
        if (module, function, root) not in user_rewards:
            if root is not None and str(root) not in sys.path:
                sys.path.insert(0, str(root))
            user_rewards[(module, function, root)] = load_reward(RewardRef(module, function), key)
        return user_rewards[(module, function, root)]

    def trl_rewards(specs: list, prompts: list, completions: list, columns: dict) -> dict:
        """Each TRL function's values for the batch, checked (rewards.trl_values) in the worker, where a bad reply
        is still the function's error."""
        out = []
        for spec in specs:
            name = f"{spec['module']}:{spec['function']}"
            try:
                values = user_reward(spec, TRL_REWARDS_KEY)(prompts=prompts, completions=completions, **columns)
            except TypeError as err:
                if "indices must be integers" not in str(err):
                    raise
                # a conversational function reading completion[0]["content"] from a string
                raise TypeError(f"{err} (in {name}: completions and prompts are plain strings, not chat messages "
                                "(docs/own-reward.md))") from None
            out.append(trl_values(values, len(completions), name))
        return {"rewards": out}

    def job(request: dict):
        if "trl_reward" in request:
            specs, completions = list(request["trl_reward"]), [str(text) for text in request["completions"]]
            prompts, columns = [str(text) for text in request["prompts"]], dict(request["columns"])
            return lambda: trl_rewards(specs, prompts, completions, columns)
        if "check_reward" in request:
            check, key = request["check_reward"], str(request.get("key") or REWARDS_KEY)
            return lambda: (user_reward(check, key), {"checked": True})[1]
        spec = request.get("reward")
        answer, item = str(request["answer"]), TaskItem.from_dict(request["item"])
        if spec is None:
            scorer = VERIFIERS[str(request["verifier"])]
            return lambda: {"reward": float(scorer(answer, item))}
        # imported inside the timed computation: a slow or failing import is the reward's
        return lambda: {"reward": float(user_reward(spec)(answer, item))}

    return _worker_loop.Handler(
        job=job,
        timed_out=lambda timeout_s: {"error": "timeout", "message": f"hit the {timeout_s:g} s timeout"},
        failed=lambda err: {"error": "exception", "type": type(err).__name__, "message": str(err)[:500]},
        bad_request=lambda err, request: {"id": request.get("id") if isinstance(request, dict) else None,
                                          "error": "exception", "type": "BadRequest",
                                          "message": f"{type(err).__name__}: {err}"},
    )


if __name__ == "__main__":
    sys.exit(_worker_loop.run("scoring worker", setup, add_arguments))
