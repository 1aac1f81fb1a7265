"""Files from someone else (issue #34, item 3): `pubswap verify`, `pubswap report` and scripts/publish_results.py
on a downloaded run directory. Every malformed file is one line naming it (exit code 2), links and FIFOs are
refused without being opened, verify runs no base model the run's config does not name (and never a hub id or
weights shipped inside the run), a hostile chat template is cut off, run-supplied text is escaped in report.md,
and publish writes nothing outside its folder and deletes nothing before everything was checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.policy.model import data_dir
from tests.unit.test_report_files import make_run
from tests.unit.test_report_publish import SWEEP, _finished_sweep, _script

SMALL = {"eval.items-per-task": 1, "eval.samples": 1, "tasks.mix": "gcd:1", "model.threads": 1}


def fake_run(root: Path, **overrides) -> Path:
    """A finished-looking fedavg run: config.json, one metrics row, a final adapter (keys the model does not have)."""
    run = root / "fedavg-s0"
    final = run / "adapters" / "final"
    final.mkdir(parents=True)
    cfg = ExperimentConfig.from_flat({**SMALL, **overrides})
    (run / "config.json").write_text(json.dumps({"run_id": "1", "config": cfg.to_flat()}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 0, "mode": "fedavg", "eval": {"greedy_accuracy": 0.5}})
                                       + "\n")
    (final / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": cfg.model.name}))
    save_file({"x": np.zeros(2, np.float32)}, str(final / "adapter_model.safetensors"))
    return run


def model_folder(path: Path, chat_template: str | None = None) -> Path:
    """A copy of the embedded tiny model, optionally with another chat template."""
    shutil.copytree(data_dir() / "models" / "tiny", path)
    if chat_template is not None:
        config = json.loads((path / "tokenizer_config.json").read_text())
        config["chat_template"] = chat_template
        (path / "tokenizer_config.json").write_text(json.dumps(config))
        (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


def one_line_error(capsys, command: str) -> str:
    """The command's error: one line after its progress lines ("verify [12 s]: ..."), never a traceback."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith(f"{command} [")]
    assert len(lines) == 1 and lines[0].startswith(f"pubswap {command}: ") and "Traceback" not in lines[0], lines
    return lines[0]


class Fifo:
    """A FIFO at `path` whose writer waits for a reader: `opened` says whether anything opened it for reading."""

    def __init__(self, path: Path, content: bytes = b"{}\n"):
        path.unlink(missing_ok=True)
        os.mkfifo(path)
        self.path, self.opened = path, False
        self.thread = threading.Thread(target=self._write, args=(content,), daemon=True)
        self.thread.start()

    def _write(self, content: bytes) -> None:
        with open(self.path, "wb") as handle:  # blocks until a reader opens the FIFO
            self.opened = True
            handle.write(content)

    def close(self) -> bool:
        """Release the writer (opening the read end ourselves); returns whether someone else had opened it."""
        opened = self.opened
        if not opened:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self.thread.join()
            os.close(fd)
        return opened


# -- verify: which base model runs ----------------------------------------------------------------------------------
def test_verify_refuses_a_base_model_the_runs_config_does_not_name(tmp_path, capsys):
    run = fake_run(tmp_path)
    planted = model_folder(tmp_path / "planted")
    (run / "adapters" / "final" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(planted)}))
    assert pubswap(["verify", str(run)]) == 2
    err = one_line_error(capsys, "verify")
    assert "adapter_config.json" in err and str(planted) in err and "embedded:tiny" in err


def test_verify_refuses_weights_shipped_inside_the_run(tmp_path, capsys):
    inside = tmp_path / "fedavg-s0" / "model"
    run = fake_run(tmp_path, **{"model.name": str(inside)})
    model_folder(inside)
    assert pubswap(["verify", str(run)]) == 2
    assert "inside the run directory" in one_line_error(capsys, "verify")


def test_verify_is_offline_and_never_tries_a_hub_id(tmp_path, capsys, monkeypatch):
    import transformers

    def network(*args, **kwargs):
        raise AssertionError("verify asked the hub")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", network)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", network)
    run = fake_run(tmp_path, **{"model.name": "someone/their-model"})
    assert pubswap(["verify", str(run)]) == 2
    err = one_line_error(capsys, "verify")
    assert "someone/their-model" in err and "offline" in err


# -- verify: malformed files ----------------------------------------------------------------------------------------
def _write(path: Path, content) -> None:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


MALFORMED_VERIFY = [
    ("config.json", b"\xff\xfe not json", "config.json"),
    ("config.json", "[1, 2]", "config.json"),
    ("config.json", '{"config": {"seed": "seven"}}', "config.json"),
    ("config.json", '{"config": {"generation.temperature": [1]}}', "config.json"),
    ("config.json", '{"run_id": "1"}', "config.json: holds no run-config keys ('config')"),
    ("config.json", '{"config": ["seed", 1]}', "config.json: config: expected `object`, got `array`"),
    ("metrics.jsonl", '{"round": 0}\n{"round": \n', "metrics.jsonl:2"),
    ("metrics.jsonl", "[1]\n", "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": "zero", "eval": {}}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 0, "eval": {"greedy_accuracy": "high"}}\n', "metrics.jsonl:1"),
    ("adapters/final/adapter_config.json", "{", "adapter_config.json"),
    ("adapters/final/adapter_config.json", '{"base_model_name_or_path": 7}', "adapter_config.json"),
    ("adapters/final/adapter_config.json", '["embedded:tiny"]', "adapter_config.json"),
    ("adapters/final/adapter_model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{\"x\":1}", "safetensors"),
    ("adapters/final/adapter_model.safetensors", None, "adapter_model.safetensors"),  # keys/shapes not the model's
]


@pytest.mark.parametrize("name, content, named", MALFORMED_VERIFY)
def test_verify_malformed_files_are_one_line_errors(tmp_path, capsys, name, content, named):
    run = fake_run(tmp_path)
    if content is not None:
        _write(run / name, content)
    assert pubswap(["verify", str(run)]) == 2
    assert named in one_line_error(capsys, "verify")


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "adapters/final/adapter_config.json",
                                  "adapters/final/adapter_model.safetensors"])
def test_verify_refuses_links_and_never_opens_a_fifo(tmp_path, capsys, name):
    run = fake_run(tmp_path / "a")
    private = tmp_path / "private.json"
    private.write_text((run / name).read_bytes().decode("latin-1"))
    (run / name).unlink()
    (run / name).symlink_to(private)
    assert pubswap(["verify", str(run)]) == 2
    assert "not a regular file" in one_line_error(capsys, "verify")

    run = fake_run(tmp_path / "b")
    fifo = Fifo(run / name, (tmp_path / "private.json").read_bytes())
    assert pubswap(["verify", str(run)]) == 2
    assert fifo.close() is False  # refused from its stat, never opened for reading
    assert "not a regular file" in one_line_error(capsys, "verify")


def test_verify_refuses_a_linked_adapter_folder(tmp_path, capsys):
    run = fake_run(tmp_path / "a")
    elsewhere = tmp_path / "elsewhere"
    (run / "adapters" / "final").rename(elsewhere)
    (run / "adapters" / "final").symlink_to(elsewhere)
    assert pubswap(["verify", str(run)]) == 2
    assert "link" in one_line_error(capsys, "verify")


# about 5 s of rendering on this machine; the bound below is 0.5 s
SLOW_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(400) %}{% endfor %}{% endfor %}"
                 "<|im_start|>user\n{{ messages[0]['content'] }}<|im_end|>\n<|im_start|>assistant\n")


def test_verify_cuts_off_a_hostile_chat_template(tmp_path, capsys, monkeypatch):
    from pubswap_flwr.results import verify

    monkeypatch.setattr(verify, "TEMPLATE_SECONDS", 0.5, raising=False)
    model = model_folder(tmp_path / "theirs", SLOW_TEMPLATE)
    run = fake_run(tmp_path / "runs", **{"model.name": str(model)})
    (run / "adapters" / "final" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(model)}))
    assert pubswap(["verify", str(run)]) == 2
    err = one_line_error(capsys, "verify")
    assert "chat template" in err and str(model) in err


# -- report -----------------------------------------------------------------------------------------------------------
MALFORMED_REPORT = [
    ("metrics.jsonl", "[1, 2]\n", "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": "3"}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": true}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 0, "eval": "good"}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 0, "eval": {"sampled_accuracy": {"a": 1}}}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 1, "time": 5}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 1, "time": null}\n', "metrics.jsonl:1: row.time: expected `object`, got `null`"),
    ("metrics.jsonl", '{"round": 1, "bytes": null}\n', "metrics.jsonl:1: row.bytes: expected `object`, got `null`"),
    ("metrics.jsonl", '{"round": 1, "clients": null}\n', "metrics.jsonl:1: row.clients: expected `object`, got `null`"),
    ("metrics.jsonl", '{"round": 1, "bytes": {"sent_by_clients": 5}}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 1, "cumulative_reward": 1' + "0" * 400 + "}\n", "metrics.jsonl:1"),
    ("metrics.jsonl", '{"round": 0, "eval": {"per_task": {"gcd": 3}}}\n', "metrics.jsonl:1"),
    ("metrics.jsonl", b"\xff\xfe\n", "metrics.jsonl"),
    ("status.json", '{"elapsed_s": "long"}', "status.json: elapsed_s: expected `float | null`, got `str`"),
    ("status.json", "[]", "status.json"),
    ("config.json", '{"config": {"generation.temperature": "hot"}}', "config.json"),
    ("config.json", "not json", "config.json"),
]


@pytest.mark.parametrize("name, content, named", MALFORMED_REPORT)
def test_report_malformed_files_are_one_line_errors(tmp_path, capsys, name, content, named):
    run = make_run(tmp_path, "fedavg", 0, 0.3)
    _write(run / name, content)
    assert pubswap(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert named in one_line_error(capsys, "report")
    assert not (tmp_path / "out" / "report.md").exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "status.json", "config.json", "provenance.json"])
def test_report_never_opens_a_fifo_or_follows_a_link(tmp_path, capsys, name):
    run = make_run(tmp_path, "fedavg", 0, 0.3)
    fifo = Fifo(run / name, (run / "metrics.jsonl").read_bytes() if name == "metrics.jsonl" else b"{}")
    assert pubswap(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    assert fifo.close() is False
    assert "not a regular file" in one_line_error(capsys, "report")

    other = make_run(tmp_path / "b", "fedavg", 0, 0.3)
    private = tmp_path / "private"
    private.write_bytes((other / "metrics.jsonl").read_bytes() if name == "metrics.jsonl" else b"{}")
    (other / name).unlink(missing_ok=True)
    (other / name).symlink_to(private)
    assert pubswap(["report", str(other), "--out", str(tmp_path / "out-b")]) == 2
    assert "not a regular file" in one_line_error(capsys, "report")


def test_report_escapes_what_runs_supply(tmp_path):
    from pubswap_flwr.report import write_report

    arm = "[click](https:evil.example)|<b>x<b>"
    run = make_run(tmp_path, arm, 0, 0.3, mode="<script>alert(1)</script>")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["eval"]["per_task"] = {"**gcd**|<img src=x>": {"sampled_accuracy": 0.5}}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "provenance.json").write_text(json.dumps({"starts": [{"code": {"commit": "<iframe src=x>"},
                                                                 "version": "![i](x)"}]}))
    text = write_report(tmp_path / "out", [run]).read_text()
    outside_code = re.sub(r"`[^`\n]*`", "", text)  # markdown in a code span is shown as written
    assert not re.search(r"<(?!/?answer>)", text)  # nor is there any HTML in one (the format note names the tags)
    for raw in ("[click](https:evil", "![i](x)", "**gcd**"):
        assert raw not in outside_code, raw
    header = next(line for line in text.splitlines() if line.startswith("| arm | mode |"))
    row = next(line for line in text.splitlines() if "alert(1)" in line)
    assert row.count("|") - row.count("\\|") == header.count("|")  # no cell split by a run's text


# -- publish ----------------------------------------------------------------------------------------------------------
def _outcomes(results: Path) -> list[dict]:
    return json.loads((results / "mini-sweep" / "outcomes.json").read_text())


def test_publish_takes_arm_names_from_the_sweep_file_only(tmp_path):
    script = _script()
    (tmp_path / "p" / "q" / "r").mkdir(parents=True)
    sweep, results = _finished_sweep(tmp_path / "p" / "q" / "r")
    evil = "../../../../escaped/planted"  # from runs/ of the results and of the publication: 4 levels up
    source = results / "mini-sweep" / "runs" / f"{evil}-s0"
    make_run(tmp_path / "tmp", "fedavg", 0, 0.3)
    source.parent.mkdir(parents=True)
    shutil.move(tmp_path / "tmp" / "runs" / "fedavg-s0", source)
    for f in ("config.json", "status.json"):
        (source / f).write_text("{}")
    outcomes = _outcomes(results) + [{"arm": evil, "seed": 0, "status": "completed", "detail": "", "run_dir": "x"}]
    (results / "mini-sweep" / "outcomes.json").write_text(json.dumps(outcomes))
    docs = tmp_path / "d1" / "d2" / "d3" / "docs"
    with pytest.raises(script.PublishError, match="not an arm of"):
        script.publish(sweep, results, docs=docs)
    assert not (tmp_path / "d1" / "d2" / "escaped").exists() and not docs.exists()

    (tmp_path / "bad.toml").write_text(SWEEP.replace("[arms.fedprox]", '[arms."../fedprox"]'))
    with pytest.raises(script.PublishError, match="not one plain path component"):
        script.publish(tmp_path / "bad.toml", results, docs=docs)
    assert not docs.exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json", "outcomes.json", "adapter"])
def test_publish_refuses_links(tmp_path, name):
    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    private = tmp_path / "private.txt"
    private.write_text('{"secret": "SECRET"}')
    run = results / "mini-sweep" / "runs" / "fedavg-s0"
    if name == "outcomes.json":
        shutil.move(results / "mini-sweep" / "outcomes.json", private)
        (results / "mini-sweep" / "outcomes.json").symlink_to(private)
    elif name == "adapter":
        (run / "adapters" / "final").mkdir(parents=True)
        (run / "adapters" / "final" / "adapter_config.json").symlink_to(private)
        save_file({"x": np.zeros(2, np.float32)}, str(run / "adapters" / "final" / "adapter_model.safetensors"))
    else:
        private.write_bytes((run / name).read_bytes())
        (run / name).unlink()
        (run / name).symlink_to(private)
    docs = tmp_path / "docs"
    with pytest.raises(script.PublishError, match="not a regular file"):
        script.publish(sweep, results, docs=docs)
    assert not docs.exists()


@pytest.mark.parametrize("break_it", ["outcomes", "metrics", "adapter", "seed", "arm-list"])
def test_publish_checks_everything_before_replacing_a_publication(tmp_path, break_it):
    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    docs = tmp_path / "docs"
    published = script.publish(sweep, results, docs=docs)
    before = {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()}
    run = results / "mini-sweep" / "runs" / "fedprox-s1"
    if break_it == "outcomes":
        (results / "mini-sweep" / "outcomes.json").write_text('[{"arm": "fedavg"}]')
    elif break_it == "metrics":
        (run / "metrics.jsonl").write_text('{"round": 0}\n{"round": "one"}\n')
    elif break_it == "adapter":
        (run / "adapters" / "final").mkdir(parents=True)
        (run / "adapters" / "final" / "adapter_config.json").write_text("{}")
        (run / "adapters" / "final" / "adapter_model.safetensors").write_bytes(b"\x00" * 5)
    else:  # a seed out of range, or an arm that is a list (it raised TypeError: found by test_file_properties)
        outcomes = _outcomes(results)
        outcomes[-1].update({"seed": 10 ** 30} if break_it == "seed" else {"arm": ["fedavg"]})
        (results / "mini-sweep" / "outcomes.json").write_text(json.dumps(outcomes))
    with pytest.raises(script.PublishError):
        script.publish(sweep, results, docs=docs, force=True)
    after = {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in docs.iterdir()) == ["mini-sweep"]  # no staging folder left behind


def test_publish_main_prints_one_line(tmp_path, capsys, monkeypatch):
    script = _script()
    sweep, results = _finished_sweep(tmp_path)
    (results / "mini-sweep" / "outcomes.json").write_text("{")
    monkeypatch.chdir(tmp_path)  # the default docs/results is relative: never the checkout's
    with pytest.raises(SystemExit) as exit_info:
        script.main([str(sweep), str(results)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("publish_results: ") and "outcomes.json" in err and "\n" not in err


# -- report: the folder it writes into may be someone else's too ---------------------------------------------------
def test_report_never_writes_through_a_link_in_its_folder(tmp_path, capsys):
    run = make_run(tmp_path / "sweep", "fedavg", 0, 0.3)
    out = tmp_path / "sweep"
    victims = {name: tmp_path / f"victim-{name}"
               for name in ("report.md", "summary.json", "plots-heldout_accuracy.png")}
    for victim in victims.values():
        victim.write_text("precious")
    (out / "report.md").symlink_to(victims["report.md"])
    (out / "summary.json").symlink_to(victims["summary.json"])
    (out / "plots").mkdir()
    (out / "plots" / "heldout_accuracy.png").symlink_to(victims["plots-heldout_accuracy.png"])
    assert pubswap(["report", str(run), "--out", str(out), "--force"]) == 2  # the old summary.json is a link
    assert "not a regular file" in one_line_error(capsys, "report")
    (out / "summary.json").unlink()
    assert pubswap(["report", str(run), "--out", str(out), "--force"]) == 0
    assert all(v.read_text() == "precious" for v in victims.values())
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text().startswith("# ")
    assert not (out / "plots" / "heldout_accuracy.png").is_symlink()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(out / "plots")
    (out / "plots").symlink_to(elsewhere)
    assert pubswap(["report", str(run), "--out", str(out), "--force"]) == 2
    assert "link" in one_line_error(capsys, "report") and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("summary", ['{"title": ["x"], "notes": 5, "arms": 3, "baseline": [1], "made_by": {}}',
                                     "[]", "{"])
def test_report_ignores_a_previous_summary_it_cannot_use(tmp_path, summary):
    run = make_run(tmp_path, "fedavg", 0, 0.3)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text(summary)
    assert pubswap(["report", str(run), "--out", str(tmp_path / "out"), "--force"]) == 0
    assert (tmp_path / "out" / "report.md").read_text().startswith("# pubswap-flwr comparison\n")


def test_verify_renders_an_ordinary_template_of_a_local_model_and_goes_on(tmp_path, capsys):
    model = model_folder(tmp_path / "mine")
    run = fake_run(tmp_path / "runs", **{"model.name": str(model)})
    (run / "adapters" / "final" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(model.resolve())}))  # as export records a local folder
    assert pubswap(["verify", str(run)]) == 2
    err = one_line_error(capsys, "verify")
    assert "adapter_model.safetensors: adapter keys do not match the model" in err  # past the template check
