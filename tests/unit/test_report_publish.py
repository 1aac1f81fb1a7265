"""scripts/publish_results.py: a published sweep is never replaced without --force, and --regenerate rewrites
its report from the committed runs with the sweep's title and notes and both commands recorded truthfully."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script
from tests.unit.test_report_files import make_run

SWEEP = '''
name = "mini-sweep"
nodes = 2
seeds = [0, 1]
notes = "Two clients, three rounds."
[config]
num-server-rounds = 3
[arms.fedavg]
strategy.mode = "fedavg"
[arms.fedprox]
strategy.mode = "fedprox"
'''


def _script():
    return load_script("scripts/publish_results.py")


def _finished_sweep(tmp_path: Path) -> tuple[Path, Path]:
    from pubswap_flwr.compare import load_sweep
    from pubswap_flwr.config import ExperimentConfig

    sweep = tmp_path / "mini-sweep.toml"
    sweep.write_text(SWEEP)
    loaded = load_sweep(sweep)
    arms = {arm.name: arm for arm in loaded.arms}
    results = tmp_path / "results"
    outcomes = []
    for arm in ("fedavg", "fedprox"):
        for seed in (0, 1):
            run = make_run(results / "mini-sweep", arm, seed, 0.2 + 0.05 * seed, mode=arm)
            config = loaded.config_for(arms[arm], seed, results / "mini-sweep")
            # as the run recorded it: `pubswap compare` reuses a completed run only when it ran its arm's config
            (run / "config.json").write_text(json.dumps({"run_id": "1",
                                                         "config": ExperimentConfig.from_flat(config).to_flat()}))
            (run / "status.json").write_text(json.dumps({"status": "completed", "elapsed_s": 6.0}))
            outcomes.append({"arm": arm, "seed": seed, "status": "completed", "detail": "", "run_dir": str(run)})
    (results / "mini-sweep" / "outcomes.json").write_text(json.dumps(outcomes))
    return sweep, results


def test_publish_then_regenerate(tmp_path):
    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    docs = tmp_path / "docs"
    published = script.publish(sweep, results, docs=docs)
    text = (published / "report.md").read_text()
    assert text.startswith("# mini-sweep\n") and "Two clients, three rounds." in text
    assert ("Runs made by `pubswap compare configs/mini-sweep.toml`; this report generated" in text
            and f"by `python scripts/publish_results.py configs/mini-sweep.toml {results}`" in text)
    assert sorted(p.name for p in (published / "runs").iterdir()) == [
        "fedavg-s0", "fedavg-s1", "fedprox-s0", "fedprox-s1"]

    with pytest.raises(script.PublishError, match="--force"):
        script.publish(sweep, results, docs=docs)
    assert (published / "report.md").read_text() == text

    script.regenerate(sweep, docs=docs)
    again = (published / "report.md").read_text()
    assert again.startswith("# mini-sweep\n") and "Two clients, three rounds." in again
    assert again == text  # the publishing command is kept: the same files give the same report, byte for byte
    (published / "summary.json").unlink()  # a folder whose summary is lost: the report names the regeneration
    script.regenerate(sweep, docs=docs)
    again = (published / "report.md").read_text()
    assert "by `python scripts/publish_results.py --regenerate configs/mini-sweep.toml`" in again
    assert "## Paired differences against fedavg" in again

    assert script.publish(sweep, results, docs=docs, force=True) == published


def test_sweep_stopped_early_is_reported_and_published_as_partial(tmp_path, capsys):
    """`pubswap compare --report-only` runs nothing: the completed runs are reported, the others listed as not run
    (not as failures), and publish_results publishes the completed ones with the same warning."""
    from pubswap_flwr.cli import main as pubswap

    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    (results / "mini-sweep" / "outcomes.json").unlink()  # the sweep was stopped: it never wrote its outcomes
    for run in ("fedprox-s1", "fedavg-s1"):  # seed 1 not made (fedavg-s1 interrupted: status "running")
        (results / "mini-sweep" / "runs" / run / "status.json").write_text(json.dumps({"status": "running"}))
    (results / "mini-sweep" / "runs" / "fedprox-s1" / "status.json").unlink()

    assert pubswap(["compare", str(sweep), "--out", str(results), "--report-only"]) == 0
    captured = capsys.readouterr()
    assert "2 run(s) not made yet: fedavg-s1, fedprox-s1" in captured.out
    assert "FAILED" not in captured.err
    outcomes = json.loads((results / "mini-sweep" / "outcomes.json").read_text())
    assert [(o["arm"], o["seed"], o["status"]) for o in outcomes] == [
        ("fedavg", 0, "completed"), ("fedprox", 0, "completed"), ("fedavg", 1, "not-run"), ("fedprox", 1, "not-run")]
    assert (results / "mini-sweep" / "runs" / "fedavg-s1").is_dir()  # --report-only clears no interrupted run
    report = (results / "mini-sweep" / "report.md").read_text()
    warning = "**Partial sweep: 2 run(s) not made yet** (fedavg seed 1, fedprox seed 1)."
    assert warning in report and "## Failed runs" not in report
    summary = json.loads((results / "mini-sweep" / "summary.json").read_text())
    assert summary["pending"] == ["fedavg-s1", "fedprox-s1"] and summary["failures"] == {}

    published = script.publish(sweep, results, docs=tmp_path / "docs")
    assert sorted(p.name for p in (published / "runs").iterdir()) == ["fedavg-s0", "fedprox-s0"]
    text = (published / "report.md").read_text()
    assert warning in text and "## Failed runs" not in text
    assert json.loads((published / "summary.json").read_text())["pending"] == ["fedavg-s1", "fedprox-s1"]


def test_whole_sweep_summary_has_no_pending_key(tmp_path):
    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    published = script.publish(sweep, results, docs=tmp_path / "docs")
    assert "pending" not in json.loads((published / "summary.json").read_text())
    assert "Partial sweep" not in (published / "report.md").read_text()


def test_report_only_keeps_a_failed_run_a_failure(tmp_path, capsys):
    from pubswap_flwr.cli import main as pubswap

    sweep, results = _finished_sweep(tmp_path)
    (results / "mini-sweep" / "runs" / "fedprox-s1" / "status.json").write_text(
        json.dumps({"status": "failed", "detail": "RuntimeError: out of memory"}))
    assert pubswap(["compare", str(sweep), "--out", str(results), "--report-only"]) == 1
    assert "FAILED fedprox seed 1: failed: RuntimeError: out of memory" in capsys.readouterr().err
    outcomes = json.loads((results / "mini-sweep" / "outcomes.json").read_text())
    assert [o["status"] for o in outcomes] == ["completed", "completed", "completed", "failed"]


def test_publication_over_the_size_cap_is_refused_and_the_old_one_stays(tmp_path, capsys, monkeypatch):
    """Clone weight (#56 item 8): a published sweep folder adds at most MAX_PUBLISHED_MB (5 MB) to the repository
    unless --max-mb says more; over it, nothing new is left behind and a publication it would replace stays."""
    script = _script()
    assert script.MAX_PUBLISHED_MB == 5.0
    sweep, results = _finished_sweep(tmp_path)
    docs = tmp_path / "docs"
    with pytest.raises(script.PublishError, match=r"adds 0\.0\d MB .* over the 0\.001 MB a published sweep may add"):
        script.publish(sweep, results, docs=docs, max_mb=0.001)
    assert not (docs / "mini-sweep").exists() and not [p for p in docs.iterdir() if p.name.startswith(".")]

    published = script.publish(sweep, results, docs=docs)  # within the default 5 MB
    before = {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()}
    with pytest.raises(script.PublishError, match="--adapter-seeds, --adapter-nodes or --no-adapters"):
        script.publish(sweep, results, docs=docs, force=True, max_mb=0.001)
    assert {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in docs.iterdir()) == ["mini-sweep"]

    monkeypatch.chdir(tmp_path)  # the command line publishes into ./docs/results
    script.main([str(sweep), str(results)])
    with pytest.raises(SystemExit) as stopped:
        script.main([str(sweep), str(results), "--force", "--max-mb", "0.001"])
    assert stopped.value.code == 2 and "over the 0.001 MB" in capsys.readouterr().err
    script.main([str(sweep), str(results), "--force", "--max-mb", "6"])
    report = (tmp_path / "docs" / "results" / "mini-sweep" / "report.md").read_text()
    # a raised cap is recorded in the report's command (after the adapter choice the command line made)
    assert f"{results} --force --adapter-seeds 0 --max-mb 6`" in report
