"""Sweep files: the shipped comparison presets parse with valid arms; bad sweep files give clear errors; a sweep skips
completed runs, runs a failed attempt again, and keeps a run whose status.json it cannot read (a failure, named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubswap_flwr.compare import SweepError, load_sweep

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name, arms, nodes, seeds", [
    ("compare-pubswap.toml", ["fedavg", "fedprox", "pubswap-random", "pubswap-balanced"], 4, [0, 1, 2]),
    ("compare-sapo.toml", ["sapo-8-0", "sapo-6-2", "sapo-4-4", "sapo-2-6"], 8, [0, 1, 2]),
    ("compare-sapo-long.toml", ["sapo-8-0", "sapo-4-4"], 8, [0]),
    ("compare-control-sapo-strong-weak.toml", ["sapo-8-0", "sapo-4-4", "sapo-2-6"], 4, [0, 1, 2]),
    ("compare-control-sapo-skills.toml", ["sapo-8-0", "sapo-4-4"], 4, [0, 1, 2]),
    ("compare-control-pubswap-experts.toml",
     ["fedavg", "fedprox", "pubswap-none", "pubswap-random", "pubswap-balanced"], 4, [0, 1, 2]),
    ("signal.toml", ["fixed", "controller", "controller-dynamic"], 2, [0, 1, 2]),
])
def test_shipped_sweeps_are_valid(name, arms, nodes, seeds):
    sweep = load_sweep(CONFIGS / name)
    assert [a.name for a in sweep.arms] == arms
    assert all(a.error is None for a in sweep.arms)
    assert sweep.nodes == nodes and sweep.seeds == seeds
    config = sweep.config_for(sweep.arms[0], 1, Path("/tmp/out"))
    assert config["seed"] == 1 and config["run-name"] == f"{arms[0]}-s1" and config["output.dir"] == "/tmp/out/runs"


@pytest.mark.parametrize("name", ["compare-sapo.toml", "compare-sapo-long.toml",
                                  "compare-control-sapo-strong-weak.toml", "compare-control-sapo-skills.toml"])
def test_sapo_sweep_ratios_sum_to_eight(name):
    sweep = load_sweep(CONFIGS / name)
    for arm in sweep.arms:
        local, external = arm.overrides["sapo.local"], arm.overrides["sapo.external"]
        assert local + external == 8 and arm.name == f"sapo-{local}-{external}"


@pytest.mark.parametrize("text, message", [
    ("name = 'x'\n", "no [arms.<name>] tables"),
    ("seeds = []\n[arms.a]\nseed = 1\n", "s.toml: seeds: expected `array` of length >= 1"),
    ("seeds = [0, -1]\n[arms.a]\nseed = 1\n", "s.toml: seeds[1]: expected `int` >= 0"),
    ("seeds = [0.5]\n[arms.a]\nseed = 1\n", "s.toml: seeds[0]: expected `int`, got `float`"),
    ("colour = 1\n[arms.a]\nseed = 1\n", "unknown sweep keys ['colour']"),
    ("[config]\ntrain.local-steps = 0\n[arms.a]\nseed = 1\n", "the base config is invalid: train.local-steps = 0"),
    ("[arms]\na = 3\n", "s.toml: arms[...]: expected `object`, got `int`"),
    ("nodes = 0\n[arms.a]\nseed = 1\n", "s.toml: nodes: expected `int` >= 1"),
    ("timeout-s = '1h'\n[arms.a]\nseed = 1\n", "s.toml: timeout-s: expected `float`, got `str`"),  # was float()'d
    ("cpus-per-client = 1.5\n[arms.a]\nseed = 1\n", "s.toml: cpus-per-client: expected `int`, got `float`"),  # cut
    ("gpus-per-client = -1\n[arms.a]\nseed = 1\n", "s.toml: gpus-per-client: expected `float` >= 0.0"),
    ("gpus-per-client = 'all'\n[arms.a]\nseed = 1\n", "s.toml: gpus-per-client: expected `float`, got `str`"),
])
def test_bad_sweep_files_are_refused_with_a_reason(tmp_path, text, message):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(SweepError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_sweep(path)


def test_an_arm_with_an_unknown_key_is_kept_with_its_error(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[arms.good]\nstrategy.mode = 'fedprox'\n[arms.bad]\nstrategy.mdoe = 'fedprox'\n")
    sweep = load_sweep(path)
    assert sweep.arms[0].error is None
    assert sweep.arms[1].error == "arm 'bad': unknown config key 'strategy.mdoe' (did you mean 'strategy.mode'?)"


def test_gpus_per_client_is_read_from_the_sweep_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("gpus-per-client = 0.25\n[arms.a]\nseed = 1\n")
    assert load_sweep(path).gpus_per_client == 0.25
    assert load_sweep(CONFIGS / "compare-sapo.toml").gpus_per_client == 0.0


def test_outcomes_of_an_only_invocation_keep_the_other_runs_in_sweep_order(tmp_path, caplog):
    import json

    from pubswap_flwr.compare import merged_outcomes

    sweep = load_sweep(CONFIGS / "real-pubswap.toml")  # 5 arms, seeds 0-2
    path = tmp_path / "outcomes.json"
    earlier = [{"arm": arm, "seed": seed, "status": "completed"} for seed in (0, 1, 2)
               for arm in ("fedavg", "pubswap-balanced")]
    path.write_text(json.dumps(earlier))
    now = [{"arm": "pubswap-none", "seed": 1, "status": "failed"}, {"arm": "fedavg", "seed": 0, "status": "completed",
                                                                     "reused": True}]
    merged = merged_outcomes(path, sweep, now)
    assert [(o["arm"], o["seed"], o["status"], o.get("reused")) for o in merged] == [
        ("fedavg", 0, "completed", True), ("pubswap-balanced", 0, "completed", None),
        ("fedavg", 1, "completed", None), ("pubswap-none", 1, "failed", None),
        ("pubswap-balanced", 1, "completed", None),
        ("fedavg", 2, "completed", None), ("pubswap-balanced", 2, "completed", None)]
    path.write_text("{not json")
    assert merged_outcomes(path, sweep, now) == [now[1], now[0]]
    assert "is not JSON" in caplog.text


def _one_arm_sweep(tmp_path, monkeypatch):
    """A one-arm, one-seed sweep whose run launcher records what it would have run."""
    from pubswap_flwr import compare

    path = tmp_path / "s.toml"
    path.write_text('seeds = [3]\n[arms.a]\nstrategy.mode = "fedavg"\n')
    launched: list = []
    monkeypatch.setattr(compare, "run_one", lambda *a, **k: launched.append(a) or (0, ""))
    return load_sweep(path), tmp_path / "out", launched


@pytest.mark.parametrize("content, reason", [
    ("{not json", "not JSON"),
    ('{"status": "completed", "elapsed_s": "ten"}', "elapsed_s: expected `float | null`, got `str`"),
    ('["completed"]', "expected `object`, got `array`"),
    ("{}", "object missing required field `status`"),  # not a run's status: write_status always writes one
    ('{"status": "ok", "detail": ""}', "status: invalid enum value 'ok'"),
])
def test_a_run_whose_status_file_is_unreadable_is_a_failure_and_is_kept(tmp_path, monkeypatch, caplog, content,
                                                                         reason):
    from pubswap_flwr.compare import run_sweep
    from pubswap_flwr.server.metrics import UNREADABLE, read_status

    sweep, out, launched = _one_arm_sweep(tmp_path, monkeypatch)
    run_dir = out / "runs" / sweep.run_name("a", 3)
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"round": 0}\n')
    (run_dir / "status.json").write_text(content)
    status = read_status(run_dir)
    assert status["status"] == UNREADABLE and str(run_dir / "status.json") in status["detail"]
    assert reason in status["detail"]
    for report_only in (False, True):
        [outcome] = run_sweep(sweep, out, report_only=report_only)
        assert outcome.status == "failed" and reason in outcome.detail
        assert outcome.detail.endswith("move the run folder away (or mend the file) to run it again")
    assert not launched  # never run over, never cleared
    assert (run_dir / "metrics.jsonl").read_text() == '{"round": 0}\n'
    assert "a seed 3: " + str(run_dir / "status.json") in caplog.text


def test_a_status_file_that_is_a_link_is_not_followed(tmp_path):
    from pubswap_flwr.server.metrics import UNREADABLE, read_status, write_status

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_status(elsewhere, "completed", "2 rounds", 10.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").symlink_to(elsewhere / "status.json")
    status = read_status(run_dir)
    assert status["status"] == UNREADABLE and "not a regular file" in status["detail"]
    assert read_status(elsewhere) == {"status": "completed", "detail": "2 rounds", "elapsed_s": 10.0}
    assert read_status(tmp_path / "none") == {}
    (tmp_path / "a-file").write_text("")
    status = read_status(tmp_path / "a-file")  # a run folder that is a file
    assert status["status"] == UNREADABLE and status["detail"].startswith(f"{tmp_path / 'a-file' / 'status.json'}: ")


def test_a_completed_run_is_skipped_and_a_broken_attempt_run_again(tmp_path, monkeypatch):
    from pubswap_flwr.compare import run_sweep
    from pubswap_flwr.server.metrics import write_status

    sweep, out, launched = _one_arm_sweep(tmp_path, monkeypatch)
    run_dir = out / "runs" / sweep.run_name("a", 3)
    _completed_run(run_dir, sweep.config_for(sweep.arms[0], 3, out))
    write_status(run_dir, "completed", "1 round", 12.5)
    [outcome] = run_sweep(sweep, out)
    assert (outcome.status, outcome.seconds, outcome.reused, launched) == ("completed", 12.5, True, [])
    write_status(run_dir, "failed", "exit 1")
    (run_dir / "metrics.jsonl").write_text('{"round": 0}\n')
    [outcome] = run_sweep(sweep, out)
    assert len(launched) == 1 and not run_dir.exists()  # the failed attempt was cleared before running again
    assert outcome.status == "failed" and outcome.detail == "exit 0: "


# -- a sweep reuses the wrong run (#54 class 5): a completed run is skipped only when it ran its arm's config now --
def _completed_run(run_dir: Path, config: dict, metrics: str | None = '{"round": 0, "mode": "fedavg"}\n') -> None:
    """A completed run as the runner leaves it: config.json (RunRecorder's form), metrics.jsonl, status.json."""
    import json

    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.server.metrics import write_status

    run_dir.mkdir(parents=True)
    flat = ExperimentConfig.from_flat(config).to_flat()
    (run_dir / "config.json").write_text(json.dumps({"run_id": "17", "config": flat}, indent=2))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text(metrics)
    write_status(run_dir, "completed", "1 round in 12.5 s", 12.5)


def _edited_sweep(tmp_path, monkeypatch):
    """A one-arm sweep whose completed run was made before its arm was edited (local steps 2 -> 3, fedavg ->
    fedprox)."""
    sweep, out, launched = _one_arm_sweep(tmp_path, monkeypatch)
    run_dir = out / "runs" / sweep.run_name("a", 3)
    _completed_run(run_dir, {**sweep.config_for(sweep.arms[0], 3, out), "train.local-steps": 2})
    (tmp_path / "s.toml").write_text('seeds = [3]\n[arms.a]\nstrategy.mode = "fedprox"\ntrain.local-steps = 3\n')
    return load_sweep(tmp_path / "s.toml"), out, launched, run_dir


def test_edited_arm_completed_run_is_refused_naming_the_keys_that_differ(tmp_path, monkeypatch, caplog):
    from pubswap_flwr.compare import run_sweep

    sweep, out, launched, run_dir = _edited_sweep(tmp_path, monkeypatch)
    before = sorted(p.name for p in run_dir.iterdir())
    for report_only in (False, True):
        [outcome] = run_sweep(sweep, out, report_only=report_only)
        assert (outcome.status, outcome.reused) == ("failed", False)
        assert str(run_dir / "config.json") in outcome.detail
        assert "strategy.mode: 'fedavg' -> 'fedprox'" in outcome.detail
        assert "train.local-steps: 2 -> 3" in outcome.detail
        assert "--rerun-edited" in outcome.detail
        # what the runner sets (run name, output folder) is not named as a difference
        assert "output.dir" not in outcome.detail and "run-name" not in outcome.detail
    assert not launched and sorted(p.name for p in run_dir.iterdir()) == before  # neither run over nor cleared
    assert "a seed 3: " in caplog.text and "train.local-steps: 2 -> 3" in caplog.text


def test_edited_arm_is_run_again_with_rerun_edited_and_the_old_run_is_moved_aside(tmp_path, monkeypatch):
    from pubswap_flwr.compare import run_sweep

    sweep, out, launched, run_dir = _edited_sweep(tmp_path, monkeypatch)
    (out / "logs").mkdir()
    (out / "logs" / "a-s3.log").write_text("the old run's log\n")
    old_config = (run_dir / "config.json").read_text()
    [outcome] = run_sweep(sweep, out, rerun_edited=True)
    [config] = [a[0] for a in launched]
    assert config["strategy.mode"] == "fedprox" and config["train.local-steps"] == 3
    [moved] = [p for p in (out / "replaced").iterdir() if p.is_dir()]  # the log is moved beside it
    assert moved.name.startswith("a-s3-")
    assert (moved / "config.json").read_text() == old_config  # kept whole, beside runs/, never deleted
    assert (moved / "metrics.jsonl").read_text() == '{"round": 0, "mode": "fedavg"}\n'
    assert (out / "replaced" / f"{moved.name}.log").read_text() == "the old run's log\n"
    assert outcome.status == "failed" and outcome.detail == "exit 0: "  # the fake launcher wrote no status


def test_edited_arm_unedited_run_is_still_skipped(tmp_path, monkeypatch):
    """Keys the runner sets or that say where and on what a run ran do not make it another arm's run."""
    from pubswap_flwr.compare import run_sweep

    sweep, out, launched = _one_arm_sweep(tmp_path, monkeypatch)
    run_dir = out / "runs" / sweep.run_name("a", 3)
    _completed_run(run_dir, {**sweep.config_for(sweep.arms[0], 3, out), "output.dir": "/moved/elsewhere/runs",
                             "resume": True, "model.threads": 4, "model.device": "cpu",
                             "deploy.warm-worker": False})
    [outcome] = run_sweep(sweep, out)
    assert (outcome.status, outcome.reused, outcome.seconds, launched) == ("completed", True, 12.5, [])


@pytest.mark.parametrize("config_json, reason", [
    (None, "config.json: missing"),
    ("{not json", "config.json: not JSON"),
    ('{"run_id": "1", "config": []}', "config: expected `object`, got `array`"),
    ('{"run_id": "1", "config": {}}', "config.json: holds no run-config keys"),
])
def test_edited_arm_run_whose_config_cannot_be_read_is_not_reused(tmp_path, monkeypatch, config_json, reason):
    from pubswap_flwr.compare import run_sweep

    sweep, out, launched = _one_arm_sweep(tmp_path, monkeypatch)
    run_dir = out / "runs" / sweep.run_name("a", 3)
    _completed_run(run_dir, sweep.config_for(sweep.arms[0], 3, out))
    if config_json is None:
        (run_dir / "config.json").unlink()
    else:
        (run_dir / "config.json").write_text(config_json)
    [outcome] = run_sweep(sweep, out)
    assert outcome.status == "failed" and reason in outcome.detail and "--rerun-edited" in outcome.detail
    assert not launched and (run_dir / "status.json").is_file()


def _compare_cli(tmp_path, *extra):
    from pubswap_flwr.cli import main as pubswap

    return pubswap(["compare", str(tmp_path / "s.toml"), "--out", str(tmp_path / "results"), *extra])


def test_edited_arm_run_is_left_out_of_the_report_and_outcomes(tmp_path, capsys):
    """`--only b` leaves arm a alone: its completed run, made before a was edited, is neither reported under a nor
    recorded as completed in outcomes.json (scripts/publish_results.py publishes from it)."""
    import json

    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 2\n[arms.b]\ntrain.local-steps = 4\n')
    sweep = load_sweep(path)
    out = tmp_path / "results" / "x"
    for arm in sweep.arms:
        _completed_run(out / "runs" / sweep.run_name(arm.name, 3), sweep.config_for(arm, 3, out))
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 3\n[arms.b]\ntrain.local-steps = 4\n')
    assert _compare_cli(tmp_path, "--only", "b") == 1
    err = capsys.readouterr().err
    assert "FAILED a seed 3: " in err and "train.local-steps: 2 -> 3" in err
    outcomes = {o["arm"]: o for o in json.loads((out / "outcomes.json").read_text())}
    assert (outcomes["b"]["status"], outcomes["b"]["reused"]) == ("completed", True)
    assert outcomes["a"]["status"] == "failed" and "train.local-steps: 2 -> 3" in outcomes["a"]["detail"]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["runs"]) == ["b-s3"] and list(summary["failures"]) == ["a-s3"]


# -- compare --report-only on a completed run without metrics: one line naming the run, no traceback --------------
@pytest.mark.parametrize("metrics, reason", [(None, "metrics.jsonl: missing"),
                                             ("", "metrics.jsonl is empty"),
                                             ("{not json\n", "metrics.jsonl:1: not a JSON row")])
def test_report_only_completed_run_without_metrics_is_named_not_a_traceback(tmp_path, capsys, metrics, reason):
    import json

    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 2\n[arms.b]\ntrain.local-steps = 4\n')
    sweep = load_sweep(path)
    out = tmp_path / "results" / "x"
    _completed_run(out / "runs" / "a-s3", sweep.config_for(sweep.arms[0], 3, out), metrics=metrics)
    _completed_run(out / "runs" / "b-s3", sweep.config_for(sweep.arms[1], 3, out))
    assert _compare_cli(tmp_path, "--report-only") == 1
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("FAILED a seed 3: ")]
    assert str(out / "runs" / "a-s3") in line and reason in line
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["runs"]) == ["b-s3"] and list(summary["failures"]) == ["a-s3"]  # b still reported
    assert (out / "runs" / "a-s3" / "status.json").is_file()  # kept as it is


# -- status.json: elapsed_s finite, detail printed without terminal control ------------------------------------------
@pytest.mark.parametrize("elapsed", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_status_file_with_a_non_finite_elapsed_time_is_unreadable(tmp_path, elapsed):
    from pubswap_flwr.server.metrics import UNREADABLE, read_status

    (tmp_path / "status.json").write_text('{"status": "completed", "detail": "", "elapsed_s": %s}' % elapsed)
    status = read_status(tmp_path)
    assert status["status"] == UNREADABLE
    assert status["detail"].startswith(f"{tmp_path / 'status.json'}: elapsed_s: ")
    assert "finite" in status["detail"]


def test_status_file_detail_with_terminal_escapes_is_printed_escaped(tmp_path):
    """A detail is text the run quoted (an error, a log's tail): line breaks and colour codes are kept visible as
    escapes, so a forged one can neither clear the screen nor add lines; the status itself still counts."""
    from pubswap_flwr.server.metrics import UNREADABLE, read_status

    (tmp_path / "status.json").write_text(
        '{"status": "failed", "detail": "\\u001b[2J\\u001b]0;owned\\u0007exit 1\\nFAKE: ok\\u009b31m\\u202e", '
        '"elapsed_s": 3}')
    status = read_status(tmp_path)
    assert status == {"status": "failed", "elapsed_s": 3.0,
                      "detail": "\\x1b[2J\\x1b]0;owned\\x07exit 1\\nFAKE: ok\\x9b31m\\u202e"}
    (tmp_path / "status.json").write_text('{"status": "done\\u001b[31m"}')  # quoted in the unreadable reason
    status = read_status(tmp_path)
    assert status["status"] == UNREADABLE and "\x1b" not in status["detail"] and "\\x1b[31m" in status["detail"]


def _gpu_sweeps(tmp_path, monkeypatch, *extra) -> tuple[int, list, list[dict]]:
    """scripts/gpu_sweeps.py on tmp_path/s.toml with its run launcher recording what it would have run: (exit code,
    the configs launched, outcomes.json)."""
    import json
    import sys

    from tests.scripts import load_script

    script = load_script("scripts/gpu_sweeps.py")
    launched: list = []
    monkeypatch.setattr(script, "run", lambda config, *a: launched.append(config) or 0)
    monkeypatch.setattr(sys, "argv", ["gpu_sweeps.py", str(tmp_path / "s.toml"), "--out", str(tmp_path / "res"),
                                      *extra])
    with pytest.raises(SystemExit) as exited:
        script.main()
    return exited.value.code, launched, json.loads((tmp_path / "res" / "x" / "outcomes.json").read_text())


def test_edited_arm_gpu_sweeps_refuses_the_old_run_and_reruns_it_only_when_asked(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 2\n')
    sweep = load_sweep(path)
    out = tmp_path / "res" / "x"
    run_dir = out / "runs" / "a-s3"
    _completed_run(run_dir, {**sweep.config_for(sweep.arms[0], 3, out), "model.threads": 1})  # as gpu_sweeps runs it
    code, launched, [outcome] = _gpu_sweeps(tmp_path, monkeypatch)
    assert (code, launched, outcome["status"], outcome["reused"]) == (0, [], "completed", True)  # unedited: reused
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 3\n')
    code, launched, [outcome] = _gpu_sweeps(tmp_path, monkeypatch)
    assert (code, launched, outcome["status"]) == (1, [], "failed")
    assert str(run_dir / "config.json") in outcome["detail"] and "train.local-steps: 2 -> 3" in outcome["detail"]
    assert "--rerun-edited" in outcome["detail"] and (run_dir / "metrics.jsonl").is_file()
    code, launched, [outcome] = _gpu_sweeps(tmp_path, monkeypatch, "--rerun-edited")
    assert [config["train.local-steps"] for config in launched] == [3]
    [moved] = list((out / "replaced").iterdir())
    assert (moved / "metrics.jsonl").is_file() and moved.name.startswith("a-s3-")


def test_a_run_just_made_that_the_report_cannot_read_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    """The runs compare reuses are read before the report (check_reuse); one it has just made is read by the report
    alone, and a file of it the report cannot use ends compare with one line naming it."""
    from pubswap_flwr import compare

    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nseeds = [3]\n[arms.a]\ntrain.local-steps = 2\n')
    out = tmp_path / "results" / "x"

    def made_without_rows(config, *args, **kwargs):
        _completed_run(out / "runs" / "a-s3", config, metrics="")
        return 0, ""

    monkeypatch.setattr(compare, "run_one", made_without_rows)
    assert _compare_cli(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"pubswap compare: no report: {out / 'runs' / 'a-s3'}: metrics.jsonl is empty"
    assert "Traceback" not in err
