"""`pubswap verify --import-rewards` imports a run's tasks.rewards only from the run's own reward modules (the app's
folder, or a folder the user put on PYTHONPATH): a config.json naming the standard library (`builtins:print`,
`shutil:rmtree`), an installed package, the app's own package or code the run directory ships is refused, naming the
reward and why, before anything is imported (issue #54 class 6)."""

from __future__ import annotations

import json
import sys

import pytest

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.results.verify import NoAdapterError, VerifyError, verify

ONLY_FROM = "verify imports a run's rewards only from reward modules in the app's folder ("


def _run(folder, rewards: str):
    """A run directory as far as verify reads it before the adapters: config.json and metrics.jsonl."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"tasks.rewards": rewards}}))
    (folder / "metrics.jsonl").write_text("")
    return folder


def _module(folder, name: str, witness) -> None:
    """A reward module `name` in `folder` that creates the file `witness` when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(f"from pathlib import Path\nPath({str(witness)!r}).touch()\n\n"
                                       "def score(answer, item):\n    return 1.0\n")


@pytest.mark.parametrize("reward, module", [
    ("builtins:print", "builtins"),
    ("shutil:rmtree", "shutil"),
    ("os:system", "os"),
    ("subprocess:run", "subprocess"),
    ("gcd=os.path:join", "os"),
    ("gcd=examples.my_reward:reward,json:loads", "json"),
])
def test_import_rewards_stdlib_refused(tmp_path, capsys, reward, module):
    run = _run(tmp_path / "run", reward)
    assert pubswap(["verify", str(run), "--import-rewards"]) == 2
    name = reward.split(",")[-1].removeprefix("gcd=")
    err = capsys.readouterr().err
    assert err.startswith(f"pubswap verify: --import-rewards: reward {name!r} refused: {module!r} is a module of "
                          "Python's standard library; ")
    assert ONLY_FROM in err and err.count("\n") == 1


def test_import_rewards_installed_package_refused(tmp_path):
    import numpy

    with pytest.raises(VerifyError) as caught:
        verify(_run(tmp_path / "run", "numpy:save"), import_rewards=True)
    message = str(caught.value)
    assert message.startswith("--import-rewards: reward 'numpy:save' refused: module 'numpy' is found at ")
    assert numpy.__file__.rsplit("/", 1)[0] in message and "in Python's library or installed packages" in message
    assert ONLY_FROM in message


def test_import_rewards_app_package_refused(tmp_path):
    with pytest.raises(VerifyError, match=r"^--import-rewards: reward 'pubswap_flwr\.untrusted:write_replacing' "
                                          r"refused: 'pubswap_flwr' is the app's own package, not a reward module"):
        verify(_run(tmp_path / "run", "pubswap_flwr.untrusted:write_replacing"), import_rewards=True)


def test_import_rewards_unknown_module_refused(tmp_path):
    with pytest.raises(VerifyError, match=r"^--import-rewards: reward 'examples\.no_such_module:reward' refused: "
                                          r"module 'examples\.no_such_module' is not found"):
        verify(_run(tmp_path / "run", "examples.no_such_module:reward"), import_rewards=True)


def test_import_rewards_module_outside_the_apps_folder_refused_without_importing_it(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    witness = tmp_path / "imported"
    _module(tmp_path / "elsewhere", "reward_elsewhere", witness)
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # importable, but no folder the user declared
    with pytest.raises(VerifyError) as caught:
        verify(_run(tmp_path / "run", "reward_elsewhere:score"), import_rewards=True)
    assert str(caught.value).startswith(
        f"--import-rewards: reward 'reward_elsewhere:score' refused: module 'reward_elsewhere' is found at "
        f"{tmp_path / 'elsewhere' / 'reward_elsewhere.py'}, outside the app's folder and PYTHONPATH; ")
    assert not witness.exists() and "reward_elsewhere" not in sys.modules


def test_import_rewards_module_the_run_ships_refused_without_importing_it(tmp_path, monkeypatch):
    """A run directory inside a PYTHONPATH folder is a namespace package there: its modules are still the run's."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    witness = tmp_path / "imported"
    run = _run(tmp_path / "shipped_run", "shipped_run.evil:score")
    _module(run, "evil", witness)
    with pytest.raises(VerifyError) as caught:
        verify(run, import_rewards=True)
    assert str(caught.value).startswith(
        f"--import-rewards: reward 'shipped_run.evil:score' refused: module 'shipped_run' is found at {run}, inside "
        f"the run directory {run} (verify never runs code a run ships); ")
    assert not witness.exists() and "shipped_run.evil" not in sys.modules


def test_import_rewards_nothing_is_imported_before_every_reward_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    witness = tmp_path / "imported"
    _module(tmp_path / "mine", "reward_first", witness)
    with pytest.raises(VerifyError, match=r"reward 'shutil:rmtree' refused"):
        verify(_run(tmp_path / "run", "gcd=reward_first:score,shutil:rmtree"), import_rewards=True)
    assert not witness.exists()


def test_import_rewards_a_pythonpath_folder_is_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    witness = tmp_path / "imported"
    _module(tmp_path / "mine", "reward_declared", witness)
    with pytest.raises(NoAdapterError):  # past the rewards, which are imported before the adapters are read
        verify(_run(tmp_path / "run", "reward_declared:score"), import_rewards=True)
    assert witness.exists()


def test_import_rewards_honest_reward_from_examples_still_works(tmp_path):
    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.results.verify import run_rewards
    from pubswap_flwr.tasks.rewards import RewardRef

    rewards = "gcd=examples.my_reward:reward,tests.unit.reward_fixtures:half_for_any_answer"
    run = _run(tmp_path / "run", rewards)
    with pytest.raises(NoAdapterError):
        verify(run, import_rewards=True)
    table, note = run_rewards(ExperimentConfig.from_flat({"tasks.rewards": rewards}), True, run)
    assert table.for_task("gcd") == RewardRef("examples.my_reward", "reward")
    assert table.for_task("chain_sum") == RewardRef("tests.unit.reward_fixtures", "half_for_any_answer")
    assert note == f"scored with the run's user rewards (tasks.rewards = {rewards!r}), imported"
