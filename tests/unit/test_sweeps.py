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
    run_dir.mkdir(parents=True)
    write_status(run_dir, "completed", "1 round", 12.5)
    [outcome] = run_sweep(sweep, out)
    assert (outcome.status, outcome.seconds, outcome.reused, launched) == ("completed", 12.5, True, [])
    write_status(run_dir, "failed", "exit 1")
    (run_dir / "metrics.jsonl").write_text('{"round": 0}\n')
    [outcome] = run_sweep(sweep, out)
    assert len(launched) == 1 and not run_dir.exists()  # the failed attempt was cleared before running again
    assert outcome.status == "failed" and outcome.detail == "exit 0: "
