"""Joining a running Ray cluster: an address nobody answers on is refused before Flower starts (Ray itself would
wait without end); `pubswap simulate --ray-address` (or `$RAY_ADDRESS`) and a sweep's `ray-address` /
`pubswap compare --ray-address` reach every arm's run."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from pubswap_flwr import cli, compare, simulation
from pubswap_flwr.compare import SweepError, load_sweep, run_one
from pubswap_flwr.simulation import reachable_ray_address


@pytest.fixture()
def listening() -> str:
    """host:port of a socket that accepts connections (a stand-in for a head node's GCS port)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture()
def closed() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"  # bound and released: nothing listens there now


def test_an_address_that_answers_is_kept(listening):
    assert reachable_ray_address(f" {listening} ") == listening
    assert reachable_ray_address("auto") == "auto"  # Ray resolves it (the cluster `ray start` left on this machine)


def test_an_address_nobody_answers_on_is_refused_with_how_to_start_a_cluster(closed):
    port = closed.rpartition(":")[2]
    with pytest.raises(ValueError, match=f"no Ray cluster answers at {closed}.*`ray start --head --port={port}`"):
        reachable_ray_address(closed)


def test_simulate_refuses_an_unreachable_cluster_before_flower_starts(closed, monkeypatch):
    monkeypatch.setattr("flwr.simulation.run_simulation", lambda **kw: pytest.fail("Flower started"))
    with pytest.raises(ValueError, match="no Ray cluster answers"):
        simulation.simulate({}, 2, ray_address=closed)
    monkeypatch.setenv("RAY_ADDRESS", closed)  # Ray's own variable counts the same
    with pytest.raises(ValueError, match="no Ray cluster answers"):
        simulation.simulate({}, 2)


def _capture_simulate(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(simulation, "simulate", lambda config, nodes, **kw: seen.update(kw))
    monkeypatch.setattr(cli.logs, "setup", lambda **kw: None)
    return seen


def test_the_cli_passes_the_cluster_address_to_the_run(listening, monkeypatch, tmp_path):
    seen = _capture_simulate(monkeypatch)
    assert cli.main(["simulate", "--out", str(tmp_path), "--ray-address", listening]) == 0
    assert seen["ray_address"] == listening
    monkeypatch.setenv("RAY_ADDRESS", listening)
    assert cli.main(["simulate", "--out", str(tmp_path)]) == 0
    assert seen["ray_address"] == listening


@pytest.mark.parametrize("args, env, message", [
    (["--ray-address", "CLOSED"], None, "error: --ray-address: no Ray cluster answers at CLOSED"),
    ([], "CLOSED", "error: RAY_ADDRESS: no Ray cluster answers at CLOSED"),
    (["--ray-address", "head-node"], None, "error: --ray-address: ray address 'head-node' is not host:port"),
    (["--ray-address", "LISTENING", "--engine", "inprocess"], None, "error: --ray-address joins a Ray cluster"),
])
def test_the_cli_refuses_a_bad_cluster_address_in_one_line(args, env, message, closed, listening, monkeypatch,
                                                           capsys, tmp_path):
    seen = _capture_simulate(monkeypatch)
    fill = {"CLOSED": closed, "LISTENING": listening}
    if env:
        monkeypatch.setenv("RAY_ADDRESS", fill[env])
    code = cli.main(["simulate", "--out", str(tmp_path)] + [fill.get(a, a) for a in args])
    assert code == 2 and not seen
    err = capsys.readouterr().err
    assert err.startswith(message.replace("CLOSED", closed)) and err.count("\n") == 1


def _recorded_commands(monkeypatch) -> list[list[str]]:
    """The commands the sweep's runs would start, recorded instead of run (each "exits" 0)."""
    commands: list[list[str]] = []

    def run(command, **kw):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(compare.subprocess, "run", run)
    return commands


def test_a_sweeps_ray_address_reaches_every_arms_process(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text('ray-address = "10.0.0.5:6379"\n[arms.a]\nseed = 1\n')
    sweep = load_sweep(path)
    assert sweep.ray_address == "10.0.0.5:6379"
    commands = _recorded_commands(monkeypatch)
    compare.run_sweep(sweep, tmp_path / "out")
    run_one({"seed": 1}, 2, 1, 60, tmp_path / "log.txt")  # no address: the arm runs on this machine
    assert commands[0][-2:] == ["--ray-address", "10.0.0.5:6379"]
    assert "--ray-address" not in commands[1] and json.loads(commands[1][-1]) == {"seed": 1}


@pytest.mark.parametrize("value, message", [('"10.0.0.5"', "is not host:port"),
                                            ("6379", r"ray-address: expected `str \| null`, got `int`"),
                                            ('"ray://10.0.0.5:10001"', "is a URL")])
def test_a_bad_ray_address_in_a_sweep_file_is_refused(tmp_path, value, message):
    path = tmp_path / "s.toml"
    path.write_text(f"ray-address = {value}\n[arms.a]\nseed = 1\n")
    with pytest.raises(SweepError, match=message):
        load_sweep(path)


def test_compare_refuses_a_bad_ray_address_in_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("[arms.a]\nseed = 1\n")
    assert cli.main(["compare", str(path), "--out", str(tmp_path), "--ray-address", "head"]) == 2
    assert capsys.readouterr().err == ("error: ray address 'head' is not host:port (the head node's `ray start "
                                       "--head --port`) or auto\n")
    assert not (tmp_path / "s").exists()  # nothing ran


def test_a_sweep_on_the_inprocess_engine_runs_its_arms_without_ray(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text('engine = "inprocess"\n[arms.a]\nseed = 1\n')
    sweep = load_sweep(path)
    assert sweep.engine == "inprocess" and load_sweep(_sweep_file(tmp_path, "")).engine == "ray"  # the default
    commands = _recorded_commands(monkeypatch)
    compare.run_sweep(sweep, tmp_path / "out")
    assert commands[0][commands[0].index("--engine") + 1] == "inprocess"
    assert "--cpus-per-client" not in commands[0] and "--ray-address" not in commands[0]


def _sweep_file(tmp_path, head: str):
    path = tmp_path / "t.toml"
    path.write_text(f"{head}\n[arms.a]\nseed = 1\n")
    return path


@pytest.mark.parametrize("head, message", [
    ('engine = "dask"', r"engine: expected one of \['inprocess', 'ray'\]|engine: invalid enum value 'dask'"),
    ('engine = "inprocess"\nray-address = "10.0.0.5:6379"', "engine = \"inprocess\" runs without Ray: "
                                                              "ray-address and gpus-per-client need engine = \"ray\""),
    ('engine = "inprocess"\ngpus-per-client = 0.5', "engine = \"inprocess\" runs without Ray: ray-address and "
                                                     "gpus-per-client need engine = \"ray\""),
])
def test_a_sweeps_engine_is_checked_with_what_needs_ray(tmp_path, head, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(_sweep_file(tmp_path, head))


def test_compare_refuses_a_ray_address_for_an_inprocess_sweep(tmp_path, capsys):
    path = _sweep_file(tmp_path, 'engine = "inprocess"')
    assert cli.main(["compare", str(path), "--out", str(tmp_path), "--ray-address", "10.0.0.5:6379"]) == 2
    assert capsys.readouterr().err == ("error: --ray-address runs the arms on a Ray cluster; the sweep file says "
                                       "engine = \"inprocess\"\n")
