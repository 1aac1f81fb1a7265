"""Portable adapter folders (tokenizer, model card, `embedded:` base reference) and `pubswap export`, on a real run;
export reads a folder someone else made as untrusted (declared JSON, safetensors only, no links)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from pubswap_flwr.cli import main
from pubswap_flwr.export import ExportError, adapter_folder, base_reference, export, load_adapter_model, render_card
from pubswap_flwr.policy.model import data_dir
from pubswap_flwr.server.metrics import read_metrics
from pubswap_flwr.simulation import simulate_in_process

RUN = {"seed": 5, "train.prompts-per-step": 2, "train.completions-per-prompt": 4, "eval.items-per-task": 3,
       "eval.samples": 1, "eval.sampled": False, "train.local-steps": 1, "num-server-rounds": 2,
       "output.report-to": "tensorboard", "run-name": "fedavg",
       "strategy.apply-below-robust": True}  # 2 nodes: below the robust minimum (#54 class 4)
QUESTION = "What is 3 + 4? Reply with only the final answer as <answer>X</answer>."


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    root = tmp_path_factory.mktemp("runs")
    simulate_in_process({**RUN, "output.dir": str(root)}, 2)
    return root / "fedavg"


def _prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)


def test_the_final_adapter_folder_is_portable(run_dir):
    final = run_dir / "adapters" / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "embedded:tiny"
    assert str(data_dir()) not in (final / "adapter_config.json").read_text()  # no path of this machine
    assert (final / "tokenizer.json").is_file() and (final / "tokenizer_config.json").is_file()
    assert not (run_dir / "adapters" / "round-0001" / "tokenizer.json").exists()  # per-round folders: weights only
    assert json.loads((run_dir / "adapters" / "round-0001" / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == "embedded:tiny"


def test_the_card_names_mode_rounds_tasks_and_the_final_metrics(run_dir):
    last = read_metrics(run_dir)[-1]
    card = (run_dir / "adapters" / "final" / "README.md").read_text()
    assert "Model Card for Model ID" not in card  # PEFT's empty template is gone
    assert "Mode `fedavg`, after round 2 of 2 (seed 5)." in card
    assert "`basic_arithmetic:1,gcd:1,count_bits:1,fraction_simplification:1,spell_backward:2`" in card
    assert f"| held-out greedy pass@1 | {last['eval']['greedy_accuracy']:.4f} |" in card
    assert f"| cumulative train reward | {last['cumulative_reward']:.4f} |" in card
    assert 'load_adapter_model("PATH/TO/THIS/FOLDER")' in card and 'from_pretrained("data/models/tiny")' in card
    first = (run_dir / "adapters" / "round-0001" / "README.md").read_text()
    assert "after round 1 of 2" in first and 'AutoTokenizer.from_pretrained("data/models/tiny")' in first
    summary = json.loads((run_dir / "adapters" / "final" / "pubswap_run.json").read_text())
    assert summary["metrics"]["eval/greedy_accuracy"] == last["eval"]["greedy_accuracy"]


def test_the_run_reported_its_rows_to_tensorboard(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    rows = read_metrics(run_dir)
    assert [(e.step, e.value) for e in events.Scalars("eval/greedy_accuracy")] == \
        [(r["round"], pytest.approx(r["eval"]["greedy_accuracy"])) for r in rows]
    assert [e.value for e in events.Scalars("cumulative_reward")] == \
        [pytest.approx(r["cumulative_reward"]) for r in rows[1:]]
    # per-client curves by node index, which line up across runs (Flower's node ids are random per run)
    clients = {tag.split("/")[1] for tag in events.Tags()["scalars"] if tag.startswith("clients/")}
    assert clients == {"node-0", "node-1"}
    assert [e.value for e in events.Scalars("clients/node-1/train_reward")] == [
        pytest.approx(c["train_reward"]) for r in rows[1:] for c in r["clients"].values() if c["node_index"] == 1]


def test_a_moved_adapter_folder_loads_with_the_runs_final_weights(run_dir, tmp_path):
    moved = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(run_dir / "adapters" / "final", moved)
    model, tokenizer = load_adapter_model(moved)
    from peft import get_peft_model_state_dict

    loaded = get_peft_model_state_dict(model)
    master = load_file(str(run_dir / "checkpoint" / "global.safetensors"))
    assert loaded.keys() == master.keys()
    assert all(torch.equal(loaded[k].float(), master[k].float()) for k in master)
    assert tokenizer.eos_token == "<|im_end|>"


def test_export_merged_loads_with_plain_transformers_and_generates(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    assert main(["export", str(run_dir), str(out), "--merged"]) == 0
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    batch = _prompt(tokenizer)
    generated = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    new = generated[0, batch["input_ids"].shape[1]:]
    assert len(new) > 0 and tokenizer.decode(new, skip_special_tokens=True).strip()
    peft_model, _ = load_adapter_model(run_dir)
    with torch.no_grad():  # the merged weights compute what base + adapter compute
        assert torch.allclose(model(**batch).logits, peft_model(**batch).logits, atol=1e-4)
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "merged into the base weights" in card
    assert "AutoModelForCausalLM.from_pretrained" in card and "PeftModel" not in card


def test_export_without_merged_copies_the_adapter_with_tokenizer_and_card(run_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    export(run_dir / "adapters" / "round-0001", out)  # a round folder: the tokenizer comes from the base
    assert {p.name for p in out.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
                                              "README.md", "pubswap_run.json"}
    assert "after round 1 of 2" in (out / "README.md").read_text()
    base = AutoModelForCausalLM.from_pretrained(str(data_dir() / "models" / "tiny"))
    model = PeftModel.from_pretrained(base, str(out))
    assert sum(1 for name, _ in model.named_parameters() if "lora_A" in name) > 0


def test_an_exported_adapter_of_an_embedded_model_loads_with_autopeft_anywhere(run_dir, tmp_path, monkeypatch):
    import os

    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    out = tmp_path / "exported"
    umask = os.umask(0o022)
    try:
        assert main(["export", str(run_dir), str(out)]) == 0
    finally:
        os.umask(umask)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((out / "base").resolve())
    assert (out / "base" / "model.safetensors").read_bytes() == (data_dir() / "models" / "tiny" /
                                                                 "model.safetensors").read_bytes()
    assert {oct(p.stat().st_mode & 0o777) for p in out.rglob("*") if p.is_file()} == {"0o644"}  # shareable
    assert {oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")] if p.is_dir()} == {"0o755"}
    card = (out / "README.md").read_text()
    assert 'AutoPeftModelForCausalLM.from_pretrained("PATH/TO/THIS/FOLDER")' in card and "`base/`" in card

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # plain transformers + peft, from any working directory
    model = AutoPeftModelForCausalLM.from_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    batch = _prompt(tokenizer)
    peft_model, _ = load_adapter_model(run_dir)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, peft_model(**batch).logits)

    # a relative reference would resolve against the working directory, not the adapter's folder
    relative = tmp_path / "relative"
    shutil.copytree(out, relative)
    (relative / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "base"}))
    with pytest.raises(OSError):
        AutoPeftModelForCausalLM.from_pretrained(str(relative))
    # a moved copy: the project's loader finds its base/, and exporting it again ships the base again
    moved = tmp_path / "moved"
    shutil.move(str(out), str(moved))
    again, _ = load_adapter_model(moved)
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, peft_model(**batch).logits)
    export(moved, tmp_path / "again")
    assert json.loads((tmp_path / "again" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str((tmp_path / "again" / "base").resolve())


def test_the_runs_own_adapter_files_are_not_private(run_dir):
    final = run_dir / "adapters" / "final"
    assert (final / "adapter_model.safetensors").stat().st_mode & 0o044 == 0o044  # safetensors alone writes 0600


def test_export_refuses_an_existing_folder_and_a_run_without_a_global_adapter(run_dir, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), str(out)]) == 2
    assert "exists and is not empty; choose another folder or pass --force" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="holds a run or the adapter being exported"):
        export(run_dir, run_dir, force=True)
    sapo = tmp_path / "sapo-run"
    (sapo / "nodes" / "partition-0" / "adapter").mkdir(parents=True)
    with pytest.raises(ExportError, match="a sapo or local run keeps one model per node"):
        adapter_folder(sapo)


def test_base_references_stay_as_given_except_embedded_names():
    assert base_reference("embedded:tiny-b", "/home/me/pubswap/data/models/tiny-b") == "embedded:tiny-b"
    assert base_reference("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert base_reference("/models/mine", "/models/mine") == "/models/mine"


def test_only_a_hub_base_goes_into_the_cards_metadata():
    summary = {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "mode": "pubswap", "round": 3, "rounds": 3, "seed": 0,
               "tasks": {"mix": "gcd:1", "per-node": 0}, "lora": {"r": 8, "alpha": 16, "targets": "all-linear"},
               "grpo": {"loss-type": "dapo"}, "metrics": {}}
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct\n" in render_card(summary)
    assert "not evaluated at this round" in render_card(summary)
    assert "base_model:" not in render_card({**summary, "base_model": "embedded:tiny"})
    assert "base_model:" not in render_card({**summary, "base_model": "/models/mine"})


def test_a_card_for_an_adapter_saved_without_a_summary_names_what_is_known(run_dir, tmp_path):
    import shutil

    from pubswap_flwr.export import SUMMARY_FILE
    bare = tmp_path / "bare"
    shutil.copytree(adapter_folder(run_dir), bare)
    (bare / SUMMARY_FILE).unlink()
    out = export(bare, tmp_path / "out")
    card = (out / "README.md").read_text()
    assert "| tasks | `?` |" in card
    assert "per node" not in card
    split = render_card({"base_model": "/m", "mode": "fedavg", "round": 1, "rounds": 1, "seed": 0,
                         "tasks": {"mix": "gcd:1", "node-mixes": "gcd:1;products:1"},
                         "lora": {"r": 8, "alpha": 16, "targets": "all-linear"}, "grpo": {}, "metrics": {}})
    assert "node mixes `gcd:1;products:1`" in split


def test_the_embedded_prefix_is_the_loaders():
    from pubswap_flwr import export as export_module
    from pubswap_flwr.policy.model import EMBEDDED_PREFIX

    assert export_module.EMBEDDED_PREFIX == EMBEDDED_PREFIX


def _copy_of_adapter(run_dir, tmp_path):
    folder = tmp_path / "theirs"
    shutil.copytree(adapter_folder(run_dir), folder)
    return folder


def _card_with(folder, **changes):
    card = json.loads((folder / "pubswap_run.json").read_text())
    return json.dumps({**card, **changes})


@pytest.mark.parametrize("name, content, message", [
    ("adapter_config.json", "{not json", "adapter_config.json: not JSON"),
    ("adapter_config.json", '["r", 8]', "adapter_config.json: expected `object`, got `array`"),
    ("adapter_config.json", '{"base_model_name_or_path": 7}', "base_model_name_or_path: expected `str | null`"),
    # a line break of any kind YAML honours would add lines to the card's YAML header
    ("pubswap_run.json", {"mode": "fedavg\nlicense: forged"}, "mode: expected `str` of one line (no line break"),
    ("pubswap_run.json", {"mode": "fedavg\n"}, "mode: expected `str` of one line"),
    ("pubswap_run.json", {"base_model": "org/m\u2028license: forged"}, "base_model: expected `str` of one line"),
    ("pubswap_run.json", {"seed": "0\u0085x"}, "seed: expected `str` of one line"),
    ("pubswap_run.json", '{"base_model": "embedded:tiny"}', "object missing required field `mode`"),
    ("adapter_model.safetensors", "truncated", "adapter_model.safetensors: not a readable safetensors file"),
])
@pytest.mark.parametrize("merged", [False, True])
def test_export_names_a_file_it_cannot_use_and_leaves_the_target_as_it_was(run_dir, tmp_path, capsys, name, content,
                                                                          message, merged):
    folder = _copy_of_adapter(run_dir, tmp_path)
    (folder / name).write_text(_card_with(folder, **content) if isinstance(content, dict) else content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(folder), str(out), "--force"] + (["--merged"] if merged else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / name}: ") and message in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "theirs"]  # no half-written folder beside it
    assert [p.name for p in out.iterdir()] == ["keep.txt"]  # --force replaces it only with a complete export


def test_export_never_loads_pickled_weights_or_follows_a_link(run_dir, tmp_path):
    folder = _copy_of_adapter(run_dir, tmp_path)
    weights = folder / "adapter_model.safetensors"
    original = adapter_folder(run_dir) / "adapter_model.safetensors"
    (tmp_path / "secret.txt").write_text("not yours")

    def refused(match, merged=False):
        with pytest.raises(ExportError, match=match):
            export(folder, tmp_path / "out", merged=merged)
        assert not (tmp_path / "out").exists()

    weights.rename(folder / "adapter_model.bin")
    refused(r"adapter_model.bin: pickled weights are never loaded from a folder someone else may have made")
    (folder / "adapter_model.bin").unlink()
    refused(r"adapter_model.safetensors: missing or not a regular file \(an adapter's weights are read as "
            r"safetensors only\)")
    weights.symlink_to(original)
    refused("adapter_model.safetensors: a link in the adapter folder; links are refused", merged=True)
    weights.unlink()
    shutil.copy(original, weights)
    for below in ("base/config.json", "additional_chat_templates/x.jinja", "tokenizer.json"):  # any depth
        link = folder / below
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(tmp_path / "secret.txt")
        refused(f"{below}: a link in the adapter folder; links are refused")
        link.unlink()
    shutil.copy(adapter_folder(run_dir) / "tokenizer.json", folder)
    (folder / "base" / "junk.safetensors").write_bytes(b"x")  # a safetensors file beside them does not help
    for pickled in ("pytorch_model.bin", "pytorch_model-00001-of-00001.bin", "model.pt"):
        (folder / "base" / pickled).write_bytes(b"not weights")
        refused(f"base/{pickled}: pickled weights are never loaded")
        (folder / "base" / pickled).unlink()
    shutil.rmtree(folder / "base")
    shutil.rmtree(folder / "additional_chat_templates")
    out = export(folder, tmp_path / "out")  # the same folder, mended, exports
    assert load_file(out / "adapter_model.safetensors").keys() == load_file(original).keys()
    assert "not yours" not in "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())


def test_a_run_directory_whose_final_adapter_is_a_link_and_an_embedded_name_out_of_models_are_refused(run_dir,
                                                                                                      tmp_path):
    from pubswap_flwr.policy.model import ModelError, resolve_model

    run = tmp_path / "their-run"
    (run / "adapters").mkdir(parents=True)
    (run / "adapters" / "final").symlink_to(adapter_folder(run_dir))
    with pytest.raises(ExportError, match=r"adapters/final: a link; .* links are refused"):
        adapter_folder(run)
    with pytest.raises(ModelError, match=r"no embedded model '\.\./models/tiny'; available: "):
        resolve_model("embedded:../models/tiny")  # a path, even one that lands in models/, is not a name
    assert resolve_model("embedded:tiny").endswith("data/models/tiny")
