"""`pubswap verify`: a run's published adapter, re-evaluated in a fresh process on items the run never saw, beside
the run's own numbers; on the run's own items it repeats them exactly (the published adapter is the evaluated one)."""

from __future__ import annotations

import json

import pytest

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.results.verify import VerifyError, final_adapters, verify
from pubswap_flwr.simulation import simulate_in_process

SMALL = {"num-server-rounds": 1, "train.local-steps": 1, "train.prompts-per-step": 2,
         "train.completions-per-prompt": 4, "eval.items-per-task": 4, "eval.samples": 2, "model.threads": 1,
         "tasks.mix": "gcd:1,count_bits:1", "tasks.per-node": 0, "seed": 4,
         "strategy.apply-below-robust": True}  # 2-node runs: below the robust minimum (#54 class 4)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    simulate_in_process({**SMALL, "output.dir": str(out), "run-name": "f"}, 2)
    return out / "f"


def test_fresh_items_beside_the_runs_own_result(fedavg_run, capsys):
    [result] = verify(fedavg_run)
    assert result["adapter"] == "global" and result["data_seed"] == 1000 and result["items"] == 8
    assert result["run_round"] == 1 and result["shared_questions"] < 8
    own = [json.loads(line) for line in (fedavg_run / "metrics.jsonl").read_text().splitlines()][-1]["eval"]
    assert result["run"] == own
    assert 0 <= result["verify"]["sampled_accuracy"] <= 1 and result["verify"]["samples"] == 2
    assert pubswap(["verify", str(fedavg_run), "--items-per-task", "3"]) == 0
    printed = capsys.readouterr().out
    assert "global adapter" in printed and "6 fresh items (tasks.data-seed 1000" in printed
    assert "sampled_accuracy" in printed


def test_on_the_runs_own_items_the_published_adapter_repeats_its_numbers(fedavg_run):
    import torch
    from safetensors.torch import load_file

    from pubswap_flwr.config import ExperimentConfig
    from pubswap_flwr.evaluation import evaluate
    from pubswap_flwr.policy import Policy
    from pubswap_flwr.settings import EvalSettings
    from pubswap_flwr.shared import policy_spec, task_universe

    cfg = ExperimentConfig.from_flat(json.loads((fedavg_run / "config.json").read_text())["config"])
    policy = Policy(policy_spec(cfg))
    policy.load_adapter(load_file(str(fedavg_run / "adapters" / "final" / "adapter_model.safetensors")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        again = evaluate(policy, task_universe(cfg).held_out.items,
                         EvalSettings(samples=2, batch_size=cfg.eval.batch_size, seed=cfg.seed))
    finally:
        torch.set_num_threads(threads)
    own = [json.loads(line) for line in (fedavg_run / "metrics.jsonl").read_text().splitlines()][-1]["eval"]
    assert again["greedy_accuracy"] == own["greedy_accuracy"]
    assert again["sampled_accuracy"] == own["sampled_accuracy"]


def test_sapo_nodes_are_verified_one_by_one(tmp_path):
    simulate_in_process({**SMALL, "strategy.mode": "sapo", "sapo.local": 1, "sapo.external": 1,
                         "sapo.completions": 2, "output.dir": str(tmp_path), "run-name": "s"}, 2)
    assert [label for label, _ in final_adapters(tmp_path / "s")] == ["node 0", "node 1"]
    results = verify(tmp_path / "s", items_per_task=2)
    assert [r["adapter"] for r in results] == ["node 0", "node 1"]
    assert all("greedy_accuracy" in r["run"] and r["items"] == 4 for r in results)


def test_refusals_name_what_is_missing(tmp_path, fedavg_run, capsys):
    with pytest.raises(VerifyError, match="has no config.json: not a run directory"):
        verify(tmp_path)
    with pytest.raises(VerifyError, match="is the run's own tasks.data-seed"):
        verify(fedavg_run, data_seed=0)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((fedavg_run / "config.json").read_text())
    (bare / "metrics.jsonl").write_text((fedavg_run / "metrics.jsonl").read_text())
    assert pubswap(["verify", str(bare)]) == 2
    assert "has no final adapter" in capsys.readouterr().err


def test_verify_on_a_published_copy(fedavg_run, tmp_path, capsys):
    """publish_results copies each run's final adapter(s), fp32 weights stored as fp16, beside its metrics; `pubswap
    verify` works on the published run alone."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file

    from tests.unit.test_report_publish import _script

    runs = tmp_path / "results" / "mini" / "runs"
    shutil.copytree(fedavg_run, runs / "fedavg-s0")
    simulate_in_process({**SMALL, "strategy.mode": "sapo", "sapo.local": 1, "sapo.external": 1,
                         "sapo.completions": 2, "output.dir": str(runs), "run-name": "sapo-s0"}, 2)
    (tmp_path / "mini.toml").write_text('name = "mini"\nnodes = 2\nseeds = [0]\n[arms.fedavg]\nstrategy.mode = '
                                        '"fedavg"\n[arms.sapo]\nstrategy.mode = "sapo"\n')
    (runs.parent / "outcomes.json").write_text(json.dumps(
        [{"arm": arm, "seed": 0, "status": "completed", "detail": "", "run_dir": str(runs / f"{arm}-s0")}
         for arm in ("fedavg", "sapo")]))
    published = _script().publish(tmp_path / "mini.toml", tmp_path / "results", docs=tmp_path / "docs") / "runs"
    assert "final adapters: 1.0 MB (fp16)" in capsys.readouterr().out  # 3 adapters of 155,648 LoRA parameters

    final = published / "fedavg-s0" / "adapters" / "final"
    assert sorted(p.name for p in final.iterdir()) == ["README.md", "adapter_config.json",
                                                       "adapter_model.safetensors", "pubswap_run.json"]
    assert not (published / "fedavg-s0" / "checkpoint").exists()
    assert sorted(p.name for p in (published / "fedavg-s0" / "adapters").iterdir()) == ["final"]
    assert sorted(p.relative_to(published / "sapo-s0").as_posix() for p in (published / "sapo-s0").rglob("adapter")) \
        == ["nodes/partition-0/adapter", "nodes/partition-1/adapter"]
    half, full = load_file(str(final / "adapter_model.safetensors")), load_file(
        str(fedavg_run / "adapters" / "final" / "adapter_model.safetensors"))
    assert half.keys() == full.keys() and all(v.dtype == np.float16 for v in half.values())
    assert all(np.array_equal(half[k], full[k].astype(np.float16)) for k in full)
    assert (final / "adapter_model.safetensors").stat().st_size < 0.51 * (
        fedavg_run / "adapters" / "final" / "adapter_model.safetensors").stat().st_size

    [result] = verify(published / "fedavg-s0")
    own = [json.loads(line) for line in (fedavg_run / "metrics.jsonl").read_text().splitlines()][-1]["eval"]
    assert result["folder"] == str(final) and result["run"] == own and result["items"] == 8
    assert [r["adapter"] for r in verify(published / "sapo-s0", items_per_task=2)] == ["node 0", "node 1"]
    assert pubswap(["verify", str(published / "fedavg-s0"), "--items-per-task", "2"]) == 0
    assert "global adapter" in capsys.readouterr().out


def test_publish_copies_only_the_chosen_seeds_adapters_readable_by_anyone(fedavg_run, tmp_path, capsys):
    """--adapter-seeds: a SAPO sweep on SmolLM2 keeps 4.9 MB per node and run; publishing one seed's adapters keeps
    every arm verifiable and the report's command says which."""
    import shutil
    import stat

    from tests.unit.test_report_publish import _script

    runs = tmp_path / "results" / "mini" / "runs"
    for seed in (0, 1):
        shutil.copytree(fedavg_run, runs / f"fedavg-s{seed}")
    (tmp_path / "mini.toml").write_text('name = "mini"\nnodes = 2\nseeds = [0, 1]\n[arms.fedavg]\n'
                                        'strategy.mode = "fedavg"\n')
    (runs.parent / "outcomes.json").write_text(json.dumps(
        [{"arm": "fedavg", "seed": seed, "status": "completed", "detail": "", "run_dir": str(runs / f"fedavg-s{seed}")}
         for seed in (0, 1)]))
    published = _script().publish(tmp_path / "mini.toml", tmp_path / "results", docs=tmp_path / "docs",
                                  adapter_seeds={1})
    assert "final adapters: 0.3 MB (fp16) of seeds [1]" in capsys.readouterr().out
    assert not (published / "runs" / "fedavg-s0" / "adapters").exists()
    weights = published / "runs" / "fedavg-s1" / "adapters" / "final" / "adapter_model.safetensors"
    assert stat.S_IMODE(weights.stat().st_mode) & 0o044 == 0o044  # group and others may read it
    assert (published / "runs" / "fedavg-s0" / "metrics.jsonl").is_file()
    assert "configs/mini.toml " + str(tmp_path / "results") + " --adapter-seeds 1`" in (
        published / "report.md").read_text()
    with pytest.raises(SystemExit):
        _script().main(["configs/x.toml", "results", "--no-adapters", "--adapter-seeds", "0"])



def test_publish_copies_only_the_chosen_sapo_nodes_adapters(fedavg_run, tmp_path, capsys):
    """--adapter-nodes: of a SAPO run (an adapter per node), only the chosen partitions' adapters are published,
    and verify finds exactly those."""
    import shutil

    from tests.unit.test_report_publish import _script

    run = tmp_path / "results" / "mini" / "runs" / "sapo-s0"
    shutil.copytree(fedavg_run, run)
    for partition in (0, 1, 2):  # a SAPO run's layout: every node's own final adapter, no global one
        shutil.copytree(run / "adapters" / "final", run / "nodes" / f"partition-{partition}" / "adapter")
    shutil.rmtree(run / "adapters")
    (tmp_path / "mini.toml").write_text('name = "mini"\nnodes = 3\nseeds = [0]\n[arms.sapo]\n'
                                        'strategy.mode = "sapo"\n')
    (run.parent.parent / "outcomes.json").write_text(json.dumps(
        [{"arm": "sapo", "seed": 0, "status": "completed", "detail": "", "run_dir": str(run)}]))
    published = _script().publish(tmp_path / "mini.toml", tmp_path / "results", docs=tmp_path / "docs",
                                  adapter_nodes={0, 2})
    assert "final adapters: 0.6 MB (fp16), nodes [0, 2] of SAPO and local runs" in capsys.readouterr().out
    copied = published / "runs" / "sapo-s0"
    assert [label for label, _ in final_adapters(copied)] == ["node 0", "node 2"]
    assert not (copied / "nodes" / "partition-1").exists()
    assert "--adapter-nodes 0 2`" in (published / "report.md").read_text()
    with pytest.raises(SystemExit):
        _script().main(["configs/x.toml", "results", "--no-adapters", "--adapter-nodes", "0"])

def test_verify_flags_a_constant_answer_adapter_on_gcd(fedavg_run, capsys, monkeypatch):
    """An adapter that answers "1" to every question (what real-pubswap's FedAvg adapters learned on gcd): verify
    prints gcd's best constant answer beside its accuracy and flags the collapse."""
    from types import SimpleNamespace

    from pubswap_flwr.policy import Policy

    def always_one(self, items, k, *, greedy=False, with_logprobs=True, greedy_first=0, item_seeds=None):
        return [[SimpleNamespace(text="<answer>1</answer>") for _ in range(k)] for _ in items]

    monkeypatch.setattr(Policy, "sample", always_one)
    [result] = verify(fedavg_run, items_per_task=40)
    gcd = result["verify"]["per_task"]["gcd"]
    assert gcd["greedy_modal_share"] == 1.0 and gcd["greedy_modal_answer"] == "1"
    assert gcd["greedy_accuracy"] <= gcd["constant_accuracy"]  # one answer for all never beats the best one
    assert gcd["constant_accuracy"] < 0.8
    assert "gcd" in result["verify"]["greedy_shortcut_tasks"]
    assert pubswap(["verify", str(fedavg_run), "--items-per-task", "40"]) == 0
    line = next(text for text in capsys.readouterr().out.splitlines() if text.strip().startswith("gcd "))
    assert "SHORTCUT: the answers collapsed onto one value" in line and "'1'" in line


def test_against_scores_a_second_run_on_the_same_fresh_items(fedavg_run, tmp_path, capsys):
    simulate_in_process({**SMALL, "seed": 5, "output.dir": str(tmp_path), "run-name": "g"}, 2)
    [result] = verify(fedavg_run, items_per_task=3, against=tmp_path / "g")
    [other] = result["against"]
    assert other["adapter"] == "global"
    first, second = result["verify"]["item_results"], other["verify"]["item_results"]
    assert first["uids"] == second["uids"] and len(first["uids"]) == 6
    expected = sum(a - b for a, b in zip(first["greedy"], second["greedy"])) / 6  # this run minus the other
    assert other["paired"]["greedy_accuracy"]["difference"] == pytest.approx(expected)
    assert other["paired"]["sampled_accuracy"]["items"] == 6
    assert pubswap(["verify", str(fedavg_run), "--items-per-task", "3", "--against", str(tmp_path / "g")]) == 0
    assert "against global adapter" in (out := capsys.readouterr().out)
    assert "on the same 6 items (this run minus it, SE over items)" in out


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    simulate_in_process({**SMALL, "strategy.mode": "local", "output.dir": str(out), "run-name": "l"}, 2)
    return out / "l"


def test_against_pairs_a_global_adapter_with_each_node_of_a_local_run(fedavg_run, local_run, monkeypatch, capsys):
    from pubswap_flwr.results import verify as module

    scored = []
    real = module._Evaluator.__call__
    monkeypatch.setattr(module._Evaluator, "__call__",
                        lambda self, base, folder, *rest: scored.append(folder) or real(self, base, folder, *rest))
    [result] = verify(fedavg_run, items_per_task=3, against=local_run)
    assert [other["adapter"] for other in result["against"]] == ["node 0", "node 1"]
    assert len(scored) == 3  # the global adapter, then each node's once
    for other in result["against"]:
        mine, theirs = result["verify"]["item_results"], other["verify"]["item_results"]
        expected = sum(a - b for a, b in zip(mine["greedy"], theirs["greedy"])) / 6
        assert other["paired"]["greedy_accuracy"]["difference"] == pytest.approx(expected)
    reverse = verify(local_run, items_per_task=3, against=fedavg_run)  # each node against the one global adapter
    assert [(r["adapter"], [o["adapter"] for o in r["against"]]) for r in reverse] == [("node 0", ["global"]),
                                                                                       ("node 1", ["global"])]
    assert len(scored) == 6  # two nodes, and the global adapter once for both
    assert pubswap(["verify", str(fedavg_run), "--items-per-task", "3", "--against", str(local_run)]) == 0
    out = capsys.readouterr().out
    assert "against node 0 adapter" in out and "against node 1 adapter" in out


def test_against_refuses_unmatched_adapters_before_scoring_any(local_run, tmp_path, monkeypatch, capsys):
    from pubswap_flwr.results import verify as module

    simulate_in_process({**SMALL, "strategy.mode": "local", "output.dir": str(tmp_path), "run-name": "three"}, 3)
    monkeypatch.setattr(module._Evaluator, "__call__", lambda *args: pytest.fail("scored before the refusal"))
    with pytest.raises(VerifyError, match=r"adapters \(node 0, node 1\) do not match the run's \(node 0, node 1, "
                                          r"node 2\)"):
        verify(tmp_path / "three", items_per_task=3, against=local_run)
    assert pubswap(["verify", str(tmp_path / "three"), "--against", str(local_run)]) == 2
    assert "do not match" in capsys.readouterr().err


@pytest.mark.parametrize("mine, theirs, expected", [
    (["global"], ["global"], {"global": ["global"]}),
    (["node 0", "node 1"], ["node 0", "node 1", "node 2"], {"node 0": ["node 0"], "node 1": ["node 1"]}),
    (["global"], ["node 0", "node 1"], {"global": ["node 0", "node 1"]}),
    (["node 0", "node 1"], ["global"], {"node 0": ["global"], "node 1": ["global"]}),
    (["node 1"], ["node 0", "node 1"], {"node 1": ["node 1"]}),
])
def test_pairings(mine, theirs, expected, tmp_path):
    from pubswap_flwr.results.verify import pairings

    assert pairings(mine, theirs, tmp_path) == expected


@pytest.mark.parametrize("mine, theirs", [
    (["node 0", "node 1"], ["node 0"]),  # node 1 would meet another partition's node
    (["node 2"], ["node 0", "node 1"]),
    (["global"], []),
])
def test_pairings_never_cross_partitions(mine, theirs, tmp_path):
    from pubswap_flwr.results.verify import pairings

    with pytest.raises(VerifyError, match=r"do not match the run's .*: compare adapters of the same label, or a run's "
                                          r"global adapter with the other's nodes"):
        pairings(mine, theirs, tmp_path)


def test_against_refuses_a_run_of_other_tasks(fedavg_run, tmp_path):
    simulate_in_process({**SMALL, "tasks.mix": "gcd:1", "output.dir": str(tmp_path), "run-name": "h"}, 2)
    with pytest.raises(VerifyError, match="evaluates other tasks"):
        verify(fedavg_run, items_per_task=2, against=tmp_path / "h")


def test_verify_says_what_it_starts_and_how_far_each_pass_got(fedavg_run):
    import io

    from pubswap_flwr.results.verify import Progress

    stream = io.StringIO()
    verify(fedavg_run, batch_size=4, progress=Progress(stream, every=0.0))  # every batch, to see each line
    lines = [line.split("]: ", 1)[1] for line in stream.getvalue().splitlines()]
    folder = fedavg_run / "adapters" / "final"
    assert lines[0] == f"1 adapter(s) of {fedavg_run}, 8 fresh items, torch threads 1 (model.threads = 1)"
    assert lines[1] == "loading base model embedded:tiny"
    assert lines[2] == f"scoring {folder} on 8 items (greedy and 2 samples each)"
    what = f"scoring {folder} on 8 items (greedy and 2 samples each)"
    # one pass: 4 sequences a batch hold one item's greedy and 2 sampled completions (evaluation.SHARED_PREFILL)
    assert lines[3:] == [f"{what}: greedy + sampled pass {n}/8 items" for n in range(1, 9)]


def test_progress_lines_come_at_most_every_ten_seconds():
    import io

    from pubswap_flwr.results.verify import Progress

    now = [0.0]
    stream = io.StringIO()
    progress = Progress(stream, clock=lambda: now[0])
    progress.start("scoring x")
    for done in range(1, 11):  # a batch every 3 s
        now[0] += 3.0
        progress("greedy", done, 10)
    assert stream.getvalue().splitlines() == ["verify [0 s]: scoring x",
                                              "verify [12 s]: scoring x: greedy pass 4/10 items",
                                              "verify [24 s]: scoring x: greedy pass 8/10 items"]


def test_publish_command_copies_the_first_seed_and_one_node_per_model_by_default(tmp_path):
    """The command's defaults keep the repository from growing: the sweep's first seed's adapters, and of a SAPO
    sweep with two models round robin partitions 0 and 1; --all-adapters and explicit choices override them."""
    from tests.unit.test_report_publish import _script

    script = _script()
    sweep_file = tmp_path / "swarm.toml"
    sweep_file.write_text('name = "swarm"\nnodes = 4\nseeds = [3, 4]\n[config]\nstrategy.mode = "sapo"\n'
                          'model.node-models = "embedded:tiny,embedded:tiny-b"\n[arms.a]\nsapo.external = 4\n')
    assert script.first_node_of_each_model(script._sweep(sweep_file)) == {0, 1}
    global_only = tmp_path / "fed.toml"
    global_only.write_text('name = "fed"\nnodes = 2\nseeds = [0]\n[arms.f]\nstrategy.mode = "fedavg"\n')
    assert script.first_node_of_each_model(script._sweep(global_only)) is None  # no per-node adapters to choose
    seen = {}
    script.publish = lambda *args, **kwargs: seen.update(kwargs) or "published"
    script.main([str(sweep_file), str(tmp_path / "results")])
    assert (seen["adapter_seeds"], seen["adapter_nodes"], seen["adapters"]) == ({3}, {0, 1}, True)
    script.main([str(sweep_file), str(tmp_path / "results"), "--all-adapters"])
    assert (seen["adapter_seeds"], seen["adapter_nodes"]) == (None, None)
    script.main([str(sweep_file), str(tmp_path / "results"), "--adapter-seeds", "4", "--adapter-nodes", "2"])
    assert (seen["adapter_seeds"], seen["adapter_nodes"]) == ({4}, {2})
    for bad in (["--all-adapters", "--adapter-seeds", "3"], ["--all-adapters", "--no-adapters"]):
        with pytest.raises(SystemExit):
            script.main([str(sweep_file), str(tmp_path / "results"), *bad])
