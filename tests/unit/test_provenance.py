"""Provenance: every run records the code and environment that made it (a resumed run each start), and a report
says which code made its runs and warns when they differ."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pubswap_flwr import provenance
from pubswap_flwr.report import write_report
from tests.unit.test_report_files import make_run


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"})


def test_git_state_clean_dirty_untracked_and_not_a_checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pubswap_flwr").mkdir(parents=True)
    (repo / "pubswap_flwr" / "a.py").write_text("x = 1\n")
    (repo / "runs").mkdir()
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    clean = provenance.git_state(repo)
    assert clean["dirty"] is False and len(clean["commit"]) == 40 and clean["changed"] == []
    (repo / "runs" / "out.txt").write_text("results do not count")
    assert provenance.git_state(repo)["dirty"] is False
    (repo / "pubswap_flwr" / "a.py").write_text("x = 2\n")
    (repo / "pubswap_flwr" / "new.py").write_text("")
    dirty = provenance.git_state(repo)
    assert dirty["dirty"] is True and dirty["changed"] == ["pubswap_flwr/a.py", "pubswap_flwr/new.py"]
    assert provenance.git_state(tmp_path / "elsewhere") == {"checkout": "not a git checkout"}


def test_written_read_back_and_appended_on_resume(tmp_path):
    first = provenance.write(tmp_path)
    assert first["start"] == "new" and first["package"] == "pubswap-flwr"
    assert set(first["packages"]) >= {"torch", "flwr", "transformers", "peft"}
    assert first["device"]["cpus"] >= 1 and first["python"].count(".") == 2
    assert "commit" in first["code"] or first["code"] == {"checkout": "not a git checkout"}
    provenance.write(tmp_path, resumed=True)
    starts = provenance.read(tmp_path)
    assert [s.start for s in starts] == ["new", "resume"]
    assert starts[0].packages == first["packages"] and starts[0].code_dir == first["code_dir"]
    written = json.loads((tmp_path / provenance.PROVENANCE_FILE).read_text())["starts"]
    assert written[0] == first  # a resume keeps the earlier start as written, undeclared keys too
    provenance.write(tmp_path)  # a new run in the same folder starts the record afresh
    assert len(provenance.read(tmp_path)) == 1
    (tmp_path / provenance.PROVENANCE_FILE).write_text("{not json")
    assert provenance.read(tmp_path) == []


def test_a_start_that_breaks_its_declaration_is_left_out_with_a_warning_naming_the_field(tmp_path, caplog):
    good = {"version": "0.1.0", "code": {"commit": "c" * 40, "dirty": False}, "extra": {"any": "thing"}}
    bad = {"version": "0.1.0", "code": {"commit": 7}}
    (tmp_path / provenance.PROVENANCE_FILE).write_text(json.dumps({"starts": [bad, good, ["not", "an object"]]}))
    with caplog.at_level("WARNING", logger="pubswap_flwr.provenance"):
        starts = provenance.read(tmp_path)
    assert [provenance.code_label(s) for s in starts] == ["ccccccc (pubswap-flwr 0.1.0)"]
    assert "starts[0].code.commit: expected `str | null`, got `int`; that start is left out" in caplog.text
    assert "starts[2]: expected `object`, got `array`; that start is left out" in caplog.text


def _record(run: Path, commit: str, dirty: bool = False, torch: str = "2.13.0+cpu", device: dict | None = None) -> None:
    entry = {"version": "0.1.0", "code": {"commit": commit, "dirty": dirty, "changed": []},
             "packages": {"torch": torch, "flwr": "1.42.0", "transformers": "5.24.0", "peft": "0.21.2"},
             **({"device": device} if device is not None else {})}
    (run / provenance.PROVENANCE_FILE).write_text(json.dumps({"starts": [entry]}))


def test_the_cpu_and_its_numeric_instruction_sets_are_recorded_and_labelled():
    device = provenance.collect()["device"]
    assert set(device["cpu_flags"]) <= set(provenance.CPU_NUMERIC_FLAGS)
    assert list(device["cpu_flags"]) == [f for f in provenance.CPU_NUMERIC_FLAGS if f in device["cpu_flags"]]
    def label(start: dict) -> str:
        return provenance.cpu_label(provenance.start_of(start))

    assert label({"device": {"cpu": "AMD EPYC"}}) == "AMD EPYC"  # a record made before the flags
    assert label({"device": {"cpu": "Xeon", "cpu_flags": ["avx2", "amx_bf16"]}}) == "Xeon (avx2, amx_bf16)"
    assert label({"device": {"cpu": "Old", "cpu_flags": []}}) == "Old (no avx2)"
    assert label({}) == "unknown CPU"
    with pytest.raises(ValueError, match=r"provenance start.device: expected `object`, got `array`"):
        label({"device": ["not", "an object"]})


def test_report_warns_when_the_runs_were_made_on_different_cpus(tmp_path):
    runs = [make_run(tmp_path, arm, 0, 0.3) for arm in ("a", "b", "c")]
    for run in runs:
        _record(run, "a" * 40, device={"cpu": "AMD EPYC"})
    assert "different CPUs" not in write_report(tmp_path / "same", runs).read_text()
    _record(runs[2], "a" * 40, device={"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": ["avx2", "amx_bf16"]})
    text = write_report(tmp_path / "mixed", runs).read_text()
    assert "**Warning: the runs were made on different CPUs,**" in text
    assert "AMD EPYC: a-s0, b-s0; Intel(R) Xeon(R) Processor (avx2, amx_bf16): c-s0." in text


def test_report_names_the_code_and_warns_when_runs_differ(tmp_path):
    runs = [make_run(tmp_path, arm, seed, 0.3) for arm in ("a", "b") for seed in (0, 1)]
    for run in runs:
        _record(run, "a" * 40)
    text = write_report(tmp_path / "same", runs).read_text()
    assert "All 4 run(s) were made by code aaaaaaa (pubswap-flwr 0.1.0) with torch 2.13.0+cpu, flwr 1.42.0" in text
    assert "Warning" not in text
    _record(runs[3], "b" * 40, dirty=True, torch="2.14.1")
    text = write_report(tmp_path / "mixed", runs).read_text()
    assert "**Warning: these runs were not all made by the same code.**" in text
    assert "bbbbbbb+changes (pubswap-flwr 0.1.0): b-s1" in text
    assert "**Warning: the runs' environments differ:**" in text
    (runs[0] / provenance.PROVENANCE_FILE).unlink()
    text = write_report(tmp_path / "old", runs).read_text()
    assert "no record (made before provenance.json): a-s0" in text
    summary = json.loads((tmp_path / "old" / "summary.json").read_text())
    assert summary["provenance"]["a-s0"] == []
    assert summary["provenance"]["b-s1"] == ["bbbbbbb+changes (pubswap-flwr 0.1.0)"]


def test_change_since_round_0_is_paired_per_seed(tmp_path):
    runs = []
    for seed, (start, end) in enumerate([(0.10, 0.30), (0.20, 0.30), (0.15, 0.40)]):
        run = make_run(tmp_path, "fedavg", seed, 0.3)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row, value in ((rows[0], start), (rows[-1], end)):
            row["eval"].update(greedy_lenient_accuracy=value + 0.2, sampled_lenient_accuracy=value + 0.1,
                               sampled_well_formed=0.9)
            row["eval"]["sampled_accuracy"] = value
        for row in rows[1:-1]:
            row["eval"].update(greedy_lenient_accuracy=0.0, sampled_lenient_accuracy=0.0, sampled_well_formed=0.0)
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        runs.append(run)
    text = write_report(tmp_path / "out", runs).read_text()
    assert "## Change since round 0" in text
    row = next(line for line in text.splitlines() if line.startswith("| fedavg | sampled strict |"))
    assert row.startswith("| fedavg | sampled strict | 0.150 | 0.333 | +0.183 [")  # (0.2 + 0.1 + 0.25) / 3
    assert "| fedavg | well-formed | 0.900 | 0.900 | 0.000 [0.000, 0.000] |" in text
    learning = json.loads((tmp_path / "out" / "summary.json").read_text())["learning"]["fedavg"]
    assert learning["sampled_lenient_accuracy"]["change"]["values"] == pytest.approx([0.2, 0.1, 0.25])
