"""A real two-organization deployment on localhost: TLS SuperLink with SuperNode authentication, keys registered with
`flwr supernode register`, one `flower-supernode` per organization with its own node-config, a PubSwap run started
with `flwr run <project> <connection>`; an unregistered key is refused and a SuperNode restarted mid-run continues
from its state dir. Every process started here is stopped by PID at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pubswap_flwr.cli import submit, wait
from pubswap_flwr.server.metrics import read_metrics

from .flower_harness import CONNECTION, ORGS, PROJECT, Deployment, _processes, descendants

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.xdist_group("deployment")]  # one worker

RUN_NAME = "deployed"
ROUNDS = 2
TAU = 2
RESTARTED = "org-b"
RUN_TIMEOUT = 420.0  # the whole run; a deployed round takes ~1-2 min on a busy 2-core machine
TINY = (f"num-server-rounds={ROUNDS} strategy.mode='pubswap' train.local-steps={TAU} pubswap.tau-swap=2 "
        "pubswap.public-prompts=2 pubswap.public-size=20 train.prompts-per-step=2 train.completions-per-prompt=4 "
        "eval.items-per-task=5 eval.sampled=false strategy.min-clients=2 strategy.timeout=600 seed=5 "
        "strategy.apply-below-robust=true")  # 2 organisations: apply their rounds (#54 keeps them by default)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    dep = Deployment(tmp_path_factory.mktemp("deployment"))
    try:
        yield dep.launch(unregistered=("rogue",))
    finally:
        left = dep.close()
    assert not left, f"processes left running after teardown: {left}"


def test_supernode_with_an_unregistered_key_is_refused(deployment):
    proc = deployment.processes["rogue"]
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the unregistered SuperNode still runs after 90 s:\n{deployment.log('rogue')}")
    assert code != 0, deployment.log("rogue")
    assert "Failed to" in deployment.log("rogue")  # "Failed to initialize the connection ... activate SuperNode"
    listed = deployment.flwr("supernode", "list", CONNECTION, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    nodes = json.loads(listed.stdout[listed.stdout.index("{"):])["nodes"]
    assert {int(n["node-id"]) for n in nodes} == set(deployment.node_ids.values())


def _round_one_recorded(run_dir: Path) -> bool:
    """Round 1's adapter is being saved or its metrics row is complete (checked by complete lines: the server may
    be writing one)."""
    if (run_dir / "adapters" / "round-0001").exists():
        return True
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and metrics.read_text().count("\n") >= 2


def _run_failed(run_dir: Path) -> str:
    status = run_dir / "status.json"
    try:
        data = json.loads(status.read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return ""
    return str(data.get("detail", "failed")) if data.get("status") == "failed" else ""


def test_two_organizations_run_pubswap_and_a_restarted_supernode_continues_from_its_state(deployment, tmp_path):
    dep = deployment
    started = time.time()
    run_dir = tmp_path / RUN_NAME
    run_id = submit(PROJECT, [f"{TINY} output.dir='{tmp_path}' run-name='{RUN_NAME}'"], "", dep.cli_env, CONNECTION)

    # SIGTERM org-b's SuperNode as soon as round 1 is recorded (the server then waits for it before round 2),
    # and start it again with the same key, port and node-config: a fresh process with no in-memory state.
    # The loop only reads local files and process states so that it notices round 1 within ~50 ms.
    deadline = time.time() + RUN_TIMEOUT
    polls = 0
    while not _round_one_recorded(run_dir):
        assert time.time() < deadline, f"round 1 did not finish in time:\n{dep.log('superlink')}"
        polls += 1
        if polls % 100 == 0:
            dep.track()
            failure = _run_failed(run_dir)
            assert not failure, f"run {run_id} failed before round 1: {failure}"
            for label in ("superlink", *ORGS):
                assert dep.processes[label].poll() is None, f"{label} exited:\n{dep.log(label)}"
        time.sleep(0.05)
    round_one = time.time() - started
    victim = dep.processes[RESTARTED]
    dep.track()
    table = _processes()
    tree = [victim.pid] + descendants(victim.pid, table)
    # Pin the restart between rounds: the ServerApp is paused while the SuperNode shuts down, so it cannot pick
    # the node for round 2 in the ~1 s between writing round 1 and selecting nodes. Once the node has deactivated
    # itself (SIGTERM), the server sees it offline and waits for it; a message sent to a node that is going
    # offline would come back as "Node Unavailable" instead.
    servers = [p for p in descendants(dep.processes["superlink"].pid, table) if "flwr-serverapp" in table[p][1]]
    assert len(servers) == 1, f"expected one flwr-serverapp below the SuperLink, found {servers}"
    os.kill(servers[0], signal.SIGSTOP)
    try:
        victim.send_signal(signal.SIGTERM)
        try:
            victim.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{RESTARTED}'s SuperNode ignored SIGTERM:\n{dep.log(RESTARTED)}")
        stopped = time.time() - started - round_one
    finally:
        os.kill(servers[0], signal.SIGCONT)
    dep.stop(tree)  # its flower-superexec child, as a service manager stops the whole unit
    dep.processes[f"{RESTARTED}-before-restart"] = dep.processes.pop(RESTARTED)
    dep.start_supernode(RESTARTED, label=f"{RESTARTED}-restarted")
    dep.processes[RESTARTED] = dep.processes[f"{RESTARTED}-restarted"]

    row = wait(run_id, dep.cli_env, CONNECTION, poll=2.0, timeout=max(10.0, deadline - time.time()))
    elapsed = time.time() - started
    assert row["status"] == "finished:completed", (row, dep.log(f"{RESTARTED}-restarted"))

    rows = read_metrics(run_dir)
    assert [r["round"] for r in rows] == list(range(ROUNDS + 1))
    ids = {str(i) for i in dep.node_ids.values()}
    for r in rows[1:]:
        assert set(r["clients"]) == ids and not r["dropped"], r.get("dropped")
        assert r["aggregated"] is True and r["swap"]["swapped_pair_fraction"] >= 0
    assert (run_dir / "adapters" / "final" / "adapter_model.safetensors").is_file()
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"

    # Each organization trained on its own file, and its state lives under <state-dir>/<run-name>.
    by_index = {list(ORGS).index(org): org for org in ORGS}
    for node_id, client in rows[1]["clients"].items():
        org = by_index[client["node_index"]]
        assert dep.node_ids[org] == int(node_id)
        assert set(client["tasks"]) <= {json.loads(line)["task"] for line in ORGS[org].read_text().splitlines()}
        state = json.loads((dep.state_dir(org) / RUN_NAME / "node.json").read_text())
        assert state["steps"] == ROUNDS * TAU and state["last_round"] == ROUNDS
        assert (dep.state_dir(org) / RUN_NAME / "adapter.safetensors").is_file()

    # The restarted node loaded its saved state: its step counter continued instead of starting from zero.
    restarted = str(dep.node_ids[RESTARTED])
    assert rows[1]["clients"][restarted]["total_steps"] == TAU
    assert rows[2]["clients"][restarted]["total_steps"] == 2 * TAU
    restarted_log = dep.log(f"{RESTARTED}-restarted", tail=1_000_000)
    assert "SuperNode ID: " + restarted in restarted_log  # same identity after the restart
    assert "Received successfully" in restarted_log  # round 2's messages went to the new process

    round_times = [round(r["time"]["round_s"], 1) for r in rows[1:]]
    print(f"deployment: rounds {round_times} s, run {elapsed:.0f} s (restart after {round_one:.0f} s, SIGTERM "
          f"to exit {stopped:.1f} s)")
