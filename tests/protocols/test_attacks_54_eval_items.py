"""Issue #54, class 2: forged per-item evaluation. A node that evaluates its own adapter (local, sapo) reports each
held-out item's correct counts, which eval_items.jsonl keeps and the report's item-level intervals average entry by
entry: one node of four listing an item many times, naming items or tasks the server did not ask for, or claiming
more right answers than samples moved a whole run's figures. Each forgery is rejected at the server's per-reply guard
with its reason, an honest reply is still recorded, a forged eval_items.jsonl is refused naming the file, round and
item, and a report can leave self-reported runs out of its headline. Property tests give one node any per-item
payload, and the report's reader any eval_items.jsonl."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.config import ExperimentConfig, catalog
from pubswap_flwr.protocols import protocol_class
from pubswap_flwr.protocols.base import RoundContext
from pubswap_flwr.report import write_report
from pubswap_flwr.report.summaries import item_values
from pubswap_flwr.rounds.exchange import Exchange
from pubswap_flwr.rounds.roundlog import RoundLog
from pubswap_flwr.server.metrics import RunRecorder, read_metrics
from pubswap_flwr.server.runner import Runner
from pubswap_flwr.shared import task_universe
from pubswap_flwr.wire.codecs import PAYLOAD_KEY, payload_from_record, payload_record
from pubswap_flwr.wire.records import config_of
from tests.protocols.fake_clients import FakeClientsGrid
from tests.protocols.test_smaller_attacks import _sapo_run
from tests.report_tables import table_row
from tests.unit.test_report_files import make_run
from tests.unit.test_task_differences import TASKS, UIDS
from tests.unit.test_task_differences import _run as items_run

QUICK = settings(max_examples=15, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SAMPLES = 4
LOCAL = {"seed": 1, "strategy.mode": "local", "strategy.min-clients": 2, "train.local-steps": 1,
         "train.completions-per-prompt": 4, "tasks.mix": "gcd:1,basic_arithmetic:1", "eval.items-per-task": 3,
         "eval.samples": SAMPLES}
SAPO = {**LOCAL, **catalog.smoke_runs()["sapo"]["config"]}
MODES = {"local": LOCAL, "sapo": SAPO}
HELD_OUT = [(item.uid, item.task) for item in task_universe(ExperimentConfig.from_flat(LOCAL)).held_out.items]
REQUESTED = dict(HELD_OUT)
FIRST, SECOND, LAST = HELD_OUT[0][0], HELD_OUT[1][0], HELD_OUT[-1][0]


# -- a run's server side against three model-free nodes that evaluate themselves ---------------------------------------
def honest_eval(index: int) -> dict:
    """What evaluate() reports for the held-out items: every item once, in order, with its task and counts."""
    greedy = [(i + index) % 2 for i in range(len(HELD_OUT))]
    sampled = [(i + index) % (SAMPLES + 1) for i in range(len(HELD_OUT))]

    def row(positions: list[int]) -> dict:
        return {"greedy_accuracy": statistics.fmean(greedy[i] for i in positions),
                "sampled_accuracy": statistics.fmean(sampled[i] / SAMPLES for i in positions),
                "sampled_reward": statistics.fmean(sampled[i] / SAMPLES for i in positions)}

    tasks = sorted({task for _, task in HELD_OUT})
    return {**row(list(range(len(HELD_OUT)))), "items": len(HELD_OUT), "samples": SAMPLES,
            "per_task": {t: row([i for i, (_, task) in enumerate(HELD_OUT) if task == t]) for t in tasks},
            "item_results": {"uids": [u for u, _ in HELD_OUT], "tasks": [t for _, t in HELD_OUT], "greedy": greedy,
                             "sampled": sampled, "samples": SAMPLES}}


def serve(tmp_path: Path, flat: dict, forge=None, rounds: int = 2) -> tuple[dict[int, dict], list[dict], Path]:
    """`rounds` server rounds of `flat` against 3 nodes (101..103) that report their own evaluation whenever the
    message asks for one; `forge(payload, round)` then rewrites node 101's reply payload. The metrics rows by round,
    eval_items.jsonl's rows as written, and the run folder."""
    def tamper(node, message, content):
        config = config_of(message.content)
        payload = payload_from_record(content[PAYLOAD_KEY])
        for key, asked in (("eval-initial", "evaluate-initial"), ("eval", "evaluate")):
            if config.get(asked):
                payload[key] = honest_eval(node - 101)
        if node == 101 and forge is not None:
            forge(payload, config["server-round"])
        content[PAYLOAD_KEY] = payload_record(payload)
        return content

    cfg = ExperimentConfig.from_flat(flat)
    protocol = protocol_class(cfg.strategy.mode).from_config(cfg, task_universe(cfg).public)
    exchange = Exchange(FakeClientsGrid(3, tamper), timeout=5, min_clients=2, fraction=1.0, seed=1, settle_seconds=0)
    recorder = RunRecorder(tmp_path / "run", cfg, "p")
    runner = Runner(cfg, recorder, protocol)
    runner.exchange = exchange
    for number in range(1, rounds + 1):
        log = RoundLog(number)
        protocol.run_round(RoundContext(number, number == rounds, True, exchange, log, "run", str(tmp_path)))
        runner._evaluate_and_record(log, final=number == rounds)
    rows = {row["round"]: row for row in read_metrics(recorder.run_dir)}
    items = [json.loads(line) for line in (recorder.run_dir / "eval_items.jsonl").read_text().splitlines()]
    return rows, items, recorder.run_dir


def each_evaluation(change):
    """A forgery applied to every evaluation node 101 reports (eval and eval-initial)."""
    def forge(payload: dict, _round: int) -> None:
        for key in ("eval", "eval-initial"):
            if key in payload:
                change(payload[key])
    return forge


def _duplicate(e: dict) -> None:
    results = e["item_results"]
    for key, value in (("uids", FIRST), ("tasks", REQUESTED[FIRST]), ("greedy", 1), ("sampled", SAMPLES)):
        results[key].append(value)


def _unknown(e: dict) -> None:
    e["item_results"]["uids"][-1] = "eval/gcd/999"


def _missing(e: dict) -> None:
    for key in ("uids", "tasks", "greedy", "sampled"):
        e["item_results"][key].pop()


def _over_samples(e: dict) -> None:
    e["item_results"]["sampled"][1] = SAMPLES + 1


def _more_samples(e: dict) -> None:  # counts within the samples it claims, but it claims more than it was asked
    e["samples"] = e["item_results"]["samples"] = 1000
    e["item_results"]["sampled"] = [1000] * len(HELD_OUT)


def _wrong_task(e: dict) -> None:
    e["item_results"]["tasks"][0] = "basic_arithmetic"


def _unknown_task(e: dict) -> None:
    e["per_task"]["zzz"] = {"greedy_accuracy": 1.0}


def _no_items(e: dict) -> None:
    del e["item_results"]


FORGERIES = {  # name -> (forgery of each evaluation, the reason's pattern)
    "duplicate": (_duplicate, rf"lists held-out item '{FIRST}' 2 times"),
    "unknown-id": (_unknown, r"item 'eval/gcd/999' is not a held-out item the server asked for"),
    "missing": (_missing, rf"lacks 1 of the {len(HELD_OUT)} held-out items the server asked for \(first: '{LAST}'\)"),
    "over-samples": (_over_samples, rf"counts {SAMPLES + 1} right of {SAMPLES} samples for item '{SECOND}'"),
    "more-samples": (_more_samples, rf"reports 1000 samples per item; the server asked for {SAMPLES}"),
    "wrong-task": (_wrong_task, rf"names task 'basic_arithmetic' for item '{FIRST}', whose task is 'gcd'"),
    "unknown-task": (_unknown_task, r"per_task names 'zzz', not a task of the held-out items"),
    "no-items": (_no_items, r"lists no per-item results \(item_results\)"),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_forged_eval_items_are_rejected_with_the_reason_and_never_recorded(tmp_path, caplog, mode, forgery):
    caplog.set_level(logging.WARNING, logger="pubswap_flwr")
    change, reason = FORGERIES[forgery]
    rows, items, _ = serve(tmp_path, MODES[mode], each_evaluation(change))
    for number in (1, 2):
        assert re.search(rf"^rejected reply: (eval|eval-initial)\.?.*{reason}", rows[number]["dropped"]["101"]), \
            rows[number]["dropped"]
        assert set(rows[number]["node_eval"]) == {"102", "103"}
    assert set(rows[0]["node_eval"]) == {"102", "103"}  # round 1's starting points, measured in the same reply
    assert [row["round"] for row in items] == [0, 1, 2]
    assert all(set(row) == {"round", "102", "103"} for row in items)
    assert re.search(rf"dropped client 101: rejected reply: .*{reason}", caplog.text)
    # the mean is over the honest nodes' own reports only
    honest = statistics.fmean(honest_eval(i)["greedy_accuracy"] for i in (1, 2))
    assert rows[2]["eval"]["greedy_accuracy"] == pytest.approx(honest)


@pytest.mark.parametrize("mode", list(MODES))
def test_forged_eval_items_an_honest_reply_is_still_recorded_whole(tmp_path, mode):
    rows, items, run = serve(tmp_path, MODES[mode])
    assert all(not rows[number]["dropped"] for number in (1, 2))
    assert [row["round"] for row in items] == [0, 1, 2]
    for row in items:
        assert set(row) == {"round", "101", "102", "103"}
        for node in ("101", "102", "103"):
            assert row[node]["uids"] == [u for u, _ in HELD_OUT] and row[node]["samples"] == SAMPLES
    assert item_values(run)[1] == REQUESTED  # each item's task, as the server knows it


@pytest.mark.parametrize("mode", list(MODES))
def test_forged_eval_items_an_evaluation_not_asked_for_is_rejected(tmp_path, mode):
    def forge(payload: dict, number: int) -> None:
        if number == 2:  # round 0's starting point again, long after round 1 measured it
            payload["eval-initial"] = honest_eval(7)

    rows, items, _ = serve(tmp_path, MODES[mode], forge)
    assert "101" not in rows[1]["dropped"]
    assert rows[2]["dropped"]["101"] == "rejected reply: eval-initial: the server did not ask for this evaluation"
    assert [row["round"] for row in items] == [0, 1, 2]  # no second round 0
    assert [row["round"] for row in rows.values()] == [0, 1, 2]


@pytest.mark.parametrize("mode", list(MODES))
def test_forged_eval_items_a_node_naming_other_tasks_no_longer_voids_the_runs_tasks(tmp_path, mode):
    rows, _, run = serve(tmp_path, MODES[mode], each_evaluation(_wrong_task))
    assert "101" in rows[2]["dropped"]
    values, tasks = item_values(run)
    assert tasks == REQUESTED  # before: {} (two records disagreed), and the run lost its per-task section
    assert set(values[2]["sampled_accuracy"]) == set(REQUESTED)


# -- any per-item payload from one node ------------------------------------------------------------------------------
@st.composite
def item_payloads(draw):
    """Node 101's per-item results: a shuffled honest list, or any list of entries, then any samples."""
    entries = [(uid, task, 1, SAMPLES) for uid, task in HELD_OUT]
    if draw(st.booleans()):
        entries = draw(st.permutations(entries))
    else:
        uids = st.sampled_from([u for u, _ in HELD_OUT] + ["eval/gcd/999", ""])
        tasks = st.sampled_from([None, "gcd", "basic_arithmetic", "zzz"])  # None: the item's own task
        raw = draw(st.lists(st.tuples(uids, tasks, st.integers(0, 1), st.integers(0, SAMPLES + 2)), min_size=1,
                            max_size=9))
        entries = [(uid, task or REQUESTED.get(uid, "gcd"), g, s) for uid, task, g, s in raw]
    samples = draw(st.sampled_from([SAMPLES, SAMPLES, SAMPLES - 1, SAMPLES + 1]))
    return entries, samples


@pytest.mark.parametrize("mode", list(MODES))
@QUICK
@given(payload=item_payloads())
def test_forged_eval_items_of_any_shape_never_reach_the_records(tmp_path_factory, mode, payload):
    entries, samples = payload

    def change(e: dict) -> None:
        e["samples"] = samples
        e["item_results"] = {"uids": [u for u, *_ in entries], "tasks": [t for _, t, *_ in entries],
                             "greedy": [g for *_, g, _ in entries], "sampled": [s for *_, s in entries],
                             "samples": samples}

    rows, items, _ = serve(tmp_path_factory.mktemp("run"), MODES[mode], each_evaluation(change))
    for number in (1, 2):
        assert ("101" in rows[number]["node_eval"]) != ("101" in rows[number]["dropped"])
        assert all(isinstance(r, str) and r for r in rows[number]["dropped"].values())
    for row in items:
        assert {"102", "103"} <= set(row)
        for key, record in row.items():
            if key == "round":
                continue
            assert Counter(record["uids"]) == Counter(list(REQUESTED))  # each requested item exactly once, nothing else
            assert [REQUESTED[u] for u in record["uids"]] == record["tasks"]
            assert record["samples"] == SAMPLES
            assert all(0 <= c <= 1 for c in record["greedy"]) and all(0 <= c <= SAMPLES for c in record["sampled"])


# -- a forged eval_items.jsonl -----------------------------------------------------------------------------------------
def _forged_file(run: Path, change) -> None:
    """Rewrite round 1's record of a run's eval_items.jsonl with `change(row)`."""
    path = run / "eval_items.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows[1])
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _file_duplicate(row: dict) -> None:
    record = row["global"]
    for key, value in (("uids", UIDS[0]), ("tasks", TASKS[0]), ("greedy", 1), ("sampled", 4)):
        record[key].append(value)


def _file_over_samples(row: dict) -> None:
    row["global"]["sampled"][1] = 5


def _file_over_the_runs_samples(row: dict) -> None:  # a record without its samples: metrics.jsonl's eval.samples
    del row["global"]["samples"]
    row["global"]["sampled"][1] = 5


def _file_greedy_over_one(row: dict) -> None:
    row["global"]["greedy"][1] = 2


def _file_short_counts(row: dict) -> None:
    row["global"]["sampled"].pop()


def _file_nodes_disagree_on_a_task(row: dict) -> None:
    record = row.pop("global")
    row["101"], row["102"] = record, {**record, "tasks": ["gcd", "gcd", "chain_sum", "gcd"]}


FILE_FORGERIES = {  # name -> (forgery of round 1's row, the error's pattern after the file and round)
    "duplicate": (_file_duplicate, r"'global' lists item 'eval/gcd/0' 2 times"),
    "over-samples": (_file_over_samples, r"'global' counts 5 right of 4 samples for item 'eval/gcd/1'"),
    "over-the-runs-samples": (_file_over_the_runs_samples, r"'global' counts 5 right of 4 samples for item "
                                                           r"'eval/gcd/1'"),
    "greedy-over-one": (_file_greedy_over_one, r"'global' counts 2 right of 1 greedy answer for item 'eval/gcd/1'"),
    "short-counts": (_file_short_counts, r"'global' lists 3 sampled counts for 4 uids"),
    "tasks-disagree": (_file_nodes_disagree_on_a_task, r"'102' names task 'gcd' for item 'eval/chain_sum/1', "
                                                       r"recorded before as 'chain_sum'"),
}


@pytest.mark.parametrize("forgery", list(FILE_FORGERIES))
def test_forged_eval_items_file_is_refused_naming_the_file_round_and_item(tmp_path, forgery):
    change, pattern = FILE_FORGERIES[forgery]
    run = items_run(tmp_path / "runs", "fedavg", 0, [4, 2, 0, 0])
    _forged_file(run, change)
    where = re.escape(str(run / "eval_items.jsonl"))
    with pytest.raises(ValueError, match=rf"^{where}(:2)?: round 1: {pattern}"):
        item_values(run, {0: 4, 1: 4})
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = pubswap(["report", str(run), "--out", str(tmp_path / "out")])
    assert code == 2 and re.match(rf"^pubswap report: {where}(:2)?: round 1: {pattern}$", err.getvalue().strip())
    assert not (tmp_path / "out" / "report.md").exists()


@QUICK
@given(records=st.lists(st.lists(st.tuples(st.sampled_from(UIDS + ["x"]), st.sampled_from(["gcd", "chain_sum"]),
                                           st.integers(-1, 2), st.integers(-1, 6)), max_size=6),
                        min_size=1, max_size=3),
       samples=st.sampled_from([None, 4]))
def test_forged_eval_items_file_of_any_counts_is_read_only_as_the_server_writes_it(tmp_path_factory, records,
                                                                                   samples):
    """Whatever round 1's records hold, item_values refuses the file with a ValueError naming it, or every record
    listed each item once, with one task per item across records and counts within 0..1 and 0..samples."""
    run = items_run(tmp_path_factory.mktemp("runs"), "sapo", 0, [4, 2, 0, 0])

    def change(row: dict) -> None:
        row.pop("global")
        for node, entries in enumerate(records):
            record = {"uids": [u for u, *_ in entries], "tasks": [t for _, t, *_ in entries],
                      "greedy": [g for *_, g, _ in entries], "sampled": [s for *_, s in entries]}
            row[str(101 + node)] = record if samples is None else {**record, "samples": samples}

    _forged_file(run, change)
    honest = all(len({u for u, *_ in entries}) == len(entries) for entries in records) and all(
        0 <= g <= 1 and 0 <= s <= 4 for entries in records for _, _, g, s in entries)
    tasks = dict(zip(UIDS, TASKS))
    for entries in records:
        for uid, task, *_ in entries:
            honest = honest and tasks.setdefault(uid, task) == task
    try:
        values, _ = item_values(run, {0: 4, 1: 4})
    except ValueError as err:
        assert str(err).startswith(str(run / "eval_items.jsonl")) and not honest, err
        return
    assert honest
    assert all(0 <= v <= 1 for metric in values[1].values() for v in metric.values())


# -- self-reported results: labelled, and left out of a headline when asked --------------------------------------------
def _local_runs(root: Path) -> list[Path]:
    """Two seeds of a server-evaluated baseline, and two of a local-mode arm whose held-out results (metrics.jsonl's
    and eval_items.jsonl's) are its node's own."""
    runs = [items_run(root, "base", s, [0, 0, 2, 2]) for s in range(2)]
    for seed in range(2):
        run = items_run(root, "local", seed, [4, 0, 2, 2])
        for name, change in (("metrics.jsonl", lambda row: row.update(mode="local", node_eval={"101": row["eval"]},
                                                                      clients={"101": {"node_index": 0}})),
                             ("eval_items.jsonl", lambda row: row.update({"101": row.pop("global")}))):
            rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
            for row in rows:
                change(row)
            (run / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        runs.append(run)
    return runs


def test_forged_eval_items_self_reported_item_results_are_labelled_in_the_report(tmp_path):
    text = write_report(tmp_path / "out", _local_runs(tmp_path / "runs"), arm_order=["base", "local"]).read_text()
    assert table_row(text, "Per task, over seeds × items", "local − base")  # the section is there
    section = text.split("## Per task, over seeds × items", 1)[1].split("\n## ", 1)[0]
    assert "(self-reported: each item's value is the mean over the nodes' own adapters, as they reported them)" \
        in section


def test_forged_eval_items_self_reported_runs_can_be_left_out_of_the_headline(tmp_path):
    fedavg = make_run(tmp_path, "fedavg", 0, 0.3)
    sapo = _sapo_run(tmp_path, {0: 0.1, 1: 0.1, 2: 0.1, 3: 1.0})
    report = write_report(tmp_path / "out", [fedavg, sapo], exclude_self_reported=True)
    text = report.read_text()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary["arms"]) == {"fedavg"} and summary["excluded_self_reported"] == ["sapo-s0"]
    assert not any(line.startswith("| sapo |") for line in text.splitlines())
    assert "## Self-reported held-out" not in text
    assert ("Left out (`--exclude-self-reported`): 1 run whose held-out results its nodes reported themselves "
            "(sapo-s0).") in text
    # the CLI: the option, recorded in the report's command so that it regenerates the same report
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = pubswap(["report", str(fedavg), str(sapo), "--out", str(tmp_path / "cli"), "--exclude-self-reported"])
    assert code == 0, err.getvalue()
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert cli["command"].endswith(" --exclude-self-reported") and set(cli["arms"]) == {"fedavg"}
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = pubswap(["report", str(sapo), "--out", str(tmp_path / "none"), "--exclude-self-reported"])
    assert code == 2 and err.getvalue().strip().splitlines()[-1] == (
        "pubswap report: --exclude-self-reported leaves no run: every run's held-out results are self-reported "
        "(sapo-s0)")


def test_self_reported_evaluation_without_a_sampled_reward_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    """A node may leave `sampled_reward` out of its evaluation; when every node does, the round's mean has a sampled
    accuracy without a reward, and the server's progress line raised KeyError there, ending the run."""
    import tests.protocols.test_attacks_54_eval_items as this

    honest = this.honest_eval

    def without_reward(index: int) -> dict:
        evaluation = honest(index)
        evaluation.pop("sampled_reward")
        for row in evaluation["per_task"].values():
            row.pop("sampled_reward")
        return evaluation

    monkeypatch.setattr(this, "honest_eval", without_reward)
    with caplog.at_level(logging.INFO, logger="pubswap_flwr"):
        rows, _items, _run = serve(tmp_path, LOCAL)
    assert sorted(rows) == [0, 1, 2]
    assert "sampled_reward" not in rows[2]["eval"]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("[round 2/"))
    assert re.search(r"held-out, self-reported by the nodes, greedy \d\.\d{3} sampled \d\.\d{3} \|", line), line
