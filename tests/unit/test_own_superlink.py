"""`pubswap run` uses a local SuperLink of this checkout's own: its FLWR_HOME under the user's data directory, keyed
by the checkout's path, and two ports recorded there (kept while free or held by that SuperLink, chosen again when a
foreign process holds one or the record is bad). Ctrl-C while following a run says the run goes on and how to
follow and stop it (exit 130); a second run while one from this checkout is in flight refuses (exit 2) unless
--another; a folder that is not a Flower app is refused first; `pubswap superlink status|stop`."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli, superlink
from pubswap_flwr.cli import main as pubswap
from pubswap_flwr.server import preflight

ROOT = Path(__file__).resolve().parents[2]
# A stand-in for flower-superlink: listens on the port given, as a console script named flower-superlink.
LISTENER = """import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
time.sleep(120)
"""
USER_VARIABLES = ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="needs Linux /proc")


@pytest.fixture()
def user(tmp_path, monkeypatch) -> dict[str, str]:
    """A user with a private home and data directory who set none of Flower's variables."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in USER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "data")}


def _fake_superlink(tmp_path: Path, port: int, flwr_home: Path) -> subprocess.Popen:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "flower-superlink"
    script.write_text(LISTENER)
    process = subprocess.Popen([sys.executable, str(script), str(port)], env={"FLWR_HOME": str(flwr_home)},
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.fixture()
def processes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=10)


def test_two_checkouts_get_their_own_homes_and_ports(user, tmp_path):
    first, second = superlink.own_link(tmp_path / "a", user), superlink.own_link(tmp_path / "b", user)
    base = tmp_path / "data" / "pubswap" / "superlink"
    assert first.home.parent == base and second.home.parent == base and first.home != second.home
    assert first.kind == second.kind == "own"
    assert len({first.port, first.control_port, second.port, second.control_port}) == 4
    assert superlink.own_link(tmp_path / "a", user) == first  # recorded, and kept while free
    assert json.loads((first.home / superlink.RECORD_FILE).read_text()) == {
        "checkout": str((tmp_path / "a").resolve()), "port": first.port, "control-port": first.control_port}
    assert first.env() == {"FLWR_HOME": str(first.home), superlink.PORT_ENV: str(first.port),
                           superlink.CONTROL_PORT_ENV: str(first.control_port)}


def test_a_recorded_port_held_by_a_foreign_process_is_chosen_again(user, tmp_path, caplog):
    link = superlink.own_link(tmp_path / "a", user)
    with socket.socket() as foreign:
        foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        foreign.bind(("127.0.0.1", link.port))
        foreign.listen()
        with caplog.at_level(logging.WARNING, logger="pubswap_flwr.superlink"):
            again = superlink.own_link(tmp_path / "a", user)
    assert again.home == link.home and again.control_port == link.control_port
    assert again.port != link.port
    assert json.loads((link.home / superlink.RECORD_FILE).read_text())["port"] == again.port
    assert f"port {link.port} recorded in {link.home / superlink.RECORD_FILE} is held by another process" \
           in caplog.text


def test_a_recorded_port_held_by_our_superlink_is_kept(user, tmp_path, processes):
    link = superlink.own_link(tmp_path / "a", user)
    processes.append(_fake_superlink(tmp_path, link.port, link.home))
    assert superlink.own_link(tmp_path / "a", user) == link
    assert superlink.serving_pid(link) == processes[0].pid
    # the same program with another FLWR_HOME is another checkout's (or the machine-wide) SuperLink
    other = superlink.own_link(tmp_path / "b", user)
    (link.home / superlink.RECORD_FILE).unlink()  # not "recorded by another checkout": only its holder tells
    (other.home / superlink.RECORD_FILE).write_text(json.dumps(
        {"checkout": str(tmp_path / "b"), "port": link.port, "control-port": other.control_port}))
    assert superlink.own_link(tmp_path / "b", user).port not in (link.port, other.control_port)


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not JSON"),
    ("[39091, 39093]", "not an object"),
    ('{"port": "39091", "control-port": 39093}', "'port' is not a port number"),
    ('{"port": 80, "control-port": 39093}', "'port' is not a port number"),
    ('{"port": 39200, "control-port": 39200}', "the two ports are the same"),
])
def test_a_bad_record_is_chosen_again_and_logged(user, tmp_path, caplog, text, problem):
    home = superlink.own_home(tmp_path / "a", user)
    home.mkdir(parents=True)
    (home / superlink.RECORD_FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr.superlink"):
        link = superlink.own_link(tmp_path / "a", user)
    assert f"{home / superlink.RECORD_FILE}: {problem}; choosing ports again" in caplog.text
    assert 1024 <= link.port <= 65535 and 1024 <= link.control_port <= 65535 and link.port != link.control_port
    assert json.loads((home / superlink.RECORD_FILE).read_text())["port"] == link.port


def test_the_users_own_choice_or_the_shared_one_is_respected(user, tmp_path):
    assert superlink.link_for(tmp_path / "a", user).kind == "own"
    mine = {**user, "FLWR_HOME": str(tmp_path / "mine"), superlink.PORT_ENV: "40001"}
    given = superlink.link_for(tmp_path / "b", mine)
    assert (given.kind, given.home, given.port, given.control_port) == ("given", tmp_path / "mine", 40001, 39093)
    shared = superlink.link_for(tmp_path / "b", user, shared=True)
    assert (shared.kind, shared.home, shared.port, shared.control_port) == (
        "shared", tmp_path / "home" / ".flwr", 39091, 39093)
    assert not superlink.own_home(tmp_path / "b", user).exists()  # nothing chosen for them


def _run(*extra: str) -> int:
    try:
        return pubswap(["run", str(ROOT), "-c", "num-server-rounds=1", "--quiet", *extra])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped `pubswap run` (a traceback for the user)")


def test_ctrl_c_while_following_says_the_run_goes_on_and_exits_130(user, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "submit", lambda *a, **k: "7")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "wait", interrupted)
    assert _run() == 130
    out, err = capsys.readouterr()
    link = superlink.own_link(ROOT, user)
    assert f"this checkout's own SuperLink on 127.0.0.1:{link.port} (FLWR_HOME={link.home}" in out
    assert "Traceback" not in err and err.count("\n") == 1
    prefix = f"FLWR_HOME={link.home} {superlink.PORT_ENV}={link.port} {superlink.CONTROL_PORT_ENV}={link.control_port}"
    flwr = cli.flwr_executable()
    assert err == (f"run 7 goes on on the SuperLink: follow it with `{prefix} {flwr} log 7 --stream`, stop it with "
                   f"`{prefix} {flwr} stop 7`\n")
    # interrupted while submitting: no run id to name
    monkeypatch.setattr(cli, "submit", interrupted)
    monkeypatch.setattr(cli, "run_statuses", lambda link: {"7": "finished:stopped"})
    assert _run() == 130
    err = capsys.readouterr().err
    assert err == (f"interrupted while submitting; if the run was submitted, `{prefix} {flwr} ls` lists it and "
                   f"`{prefix} {flwr} stop RUN_ID` stops it\n")


def test_a_second_run_while_one_is_in_flight_refuses_unless_another(user, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ids = iter(["7", "8", "9"])
    submitted = []

    def submit(*args, **kwargs):
        submitted.append(next(ids))
        return submitted[-1]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "submit", submit)
    monkeypatch.setattr(cli, "wait", interrupted)
    assert _run() == 130  # run 7 goes on
    capsys.readouterr()
    monkeypatch.setattr(cli, "run_statuses", lambda link: {"7": "running"})
    assert _run() == 2
    link = superlink.own_link(ROOT, user)
    prefix = f"FLWR_HOME={link.home} {superlink.PORT_ENV}={link.port} {superlink.CONTROL_PORT_ENV}={link.control_port}"
    flwr = cli.flwr_executable()
    assert capsys.readouterr().err == (
        f"error: run 7 from this checkout is still running on 127.0.0.1:{link.port}: follow it with `{prefix} {flwr} "
        f"log 7 --stream`, stop it with `{prefix} {flwr} stop 7`, or pass --another to start one beside it\n")
    assert submitted == ["7"]
    monkeypatch.setattr(cli, "wait", lambda *a, **k: {"status": "finished:completed", "elapsed": 1.0})
    assert _run("--another") == 0 and submitted == ["7", "8"]
    record = json.loads((link.home / superlink.SUBMITTED_FILE).read_text())
    assert [entry["run-id"] for entry in record["runs"]] == ["7"]  # 8 finished while followed: forgotten
    # once Flower says run 7 finished, a plain run goes ahead, and run 7 is forgotten
    monkeypatch.setattr(cli, "run_statuses", lambda link: {"7": "finished:completed"})
    assert _run() == 0 and submitted == ["7", "8", "9"]
    assert json.loads((link.home / superlink.SUBMITTED_FILE).read_text()) == {"runs": []}


def test_run_statuses_asks_no_flwr_when_no_superlink_listens(user, tmp_path, monkeypatch):
    link = superlink.own_link(tmp_path / "a", user)
    monkeypatch.setattr(cli, "_flwr", lambda *a, **k: pytest.fail("flwr ls would start a SuperLink"))
    assert cli.run_statuses(link) == {}


def test_a_bad_submitted_record_is_logged_and_not_trusted(user, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    link = superlink.own_link(ROOT, user)
    (link.home / superlink.SUBMITTED_FILE).write_text('{"runs": [{"run-id": "7; rm -rf ~"}]}')
    monkeypatch.setattr(cli, "submit", lambda *a, **k: "8")
    monkeypatch.setattr(cli, "wait", lambda *a, **k: {"status": "finished:completed", "elapsed": 1.0})
    monkeypatch.setattr(cli, "run_statuses", lambda link: pytest.fail("nothing to ask about"))
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr.superlink"):
        assert _run() == 0
    assert f"{link.home / superlink.SUBMITTED_FILE}: runs[0]: 'run-id' is not a run id; the record is started again" \
           in caplog.text


@pytest.mark.parametrize("pyproject", [None, '[project]\nname = "something-else"\n'])
def test_run_outside_a_flower_app_says_to_run_it_from_the_checkout(user, tmp_path, monkeypatch, capsys, pyproject):
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "submit", lambda *a, **k: pytest.fail("submitted"))
    monkeypatch.setattr(superlink, "link_for", lambda *a, **k: pytest.fail("a SuperLink was looked for"))
    assert pubswap(["run"]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path} is not a Flower app (no pyproject.toml with [tool.flwr.app]): run `pubswap run` from "
        f"the pubswap-flwr checkout, or pass its folder: `pubswap run {ROOT}`\n")


def test_superlink_status_and_stop(user, tmp_path, monkeypatch, capsys, processes):
    monkeypatch.chdir(ROOT)
    assert pubswap(["superlink", "status"]) == 0
    link = superlink.own_link(ROOT, user)
    assert capsys.readouterr().out == (f"this checkout's own SuperLink on 127.0.0.1:{link.port} "
                                       f"(FLWR_HOME={link.home}): not running\n")
    processes.append(_fake_superlink(tmp_path, link.port, link.home))
    pid = processes[0].pid
    assert pubswap(["superlink", "status"]) == 0
    assert capsys.readouterr().out == (f"this checkout's own SuperLink on 127.0.0.1:{link.port} "
                                       f"(FLWR_HOME={link.home}): running, pid {pid}\n")
    # a run in flight: stop refuses unless --force
    (link.home / superlink.SUBMITTED_FILE).write_text(json.dumps({"runs": [
        {"run-id": "7", "flwr-home": str(link.home), "port": link.port, "control-port": link.control_port}]}))
    monkeypatch.setattr(cli, "run_statuses", lambda link: {"7": "running"})
    assert pubswap(["superlink", "stop"]) == 2
    assert capsys.readouterr().err == ("error: run 7 is still running on it; `pubswap superlink stop --force` "
                                       "stops it with the SuperLink\n")
    assert processes[0].poll() is None
    assert pubswap(["superlink", "stop", "--force"]) == 0
    assert processes[0].wait(timeout=10) is not None
    assert capsys.readouterr().out == f"stopped this checkout's own SuperLink (pid {pid}, 127.0.0.1:{link.port})\n"


def test_the_control_port_held_by_our_superlink_is_kept(user, tmp_path, processes):
    link = superlink.own_link(tmp_path / "a", user)
    processes.append(_fake_superlink(tmp_path, link.control_port, link.home))  # FLWR_INTERNAL_GRPC_CONTROL_API=1
    assert superlink.own_link(tmp_path / "a", user) == link


def test_without_proc_a_recorded_port_in_use_is_taken_to_be_ours(user, tmp_path):
    no_proc = tmp_path / "no-proc"
    no_proc.mkdir()
    link = superlink.own_link(tmp_path / "a", user, proc=no_proc)
    assert not superlink.serves(link, no_proc)
    assert superlink.describe(link, no_proc).endswith(": not running")
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", link.port))
        holder.listen()
        assert superlink.own_link(tmp_path / "a", user, proc=no_proc) == link
        assert superlink.serves(link, no_proc) and superlink.serving_pid(link, no_proc) is None
        assert superlink.describe(link, no_proc).endswith(": port in use (without /proc its process is not checked)")


def test_an_installed_package_names_no_checkout_it_does_not_have(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    monkeypatch.setattr(cli, "__file__", str(site / "pubswap_flwr" / "cli.py"))
    assert cli.app_problem(tmp_path) == (
        f"{tmp_path} is not a Flower app (no pyproject.toml with [tool.flwr.app]): run `pubswap run` from the "
        "pubswap-flwr checkout, or pass its folder: `pubswap run /path/to/pubswap-flwr`")


def test_a_refused_second_run_leaves_its_run_name_free(user, tmp_path, monkeypatch, capsys):
    # the name is claimed in the pre-check, before the in-flight check refuses: the refusal must give it back
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "submit", lambda *a, **k: "7")
    monkeypatch.setattr(cli, "wait", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert _run() == 130  # run 7 goes on
    monkeypatch.setattr(cli, "run_statuses", lambda link: {"7": "running"})
    assert _run("-c", "run-name='named'") == 2
    assert "run 7 from this checkout is still running" in capsys.readouterr().err
    named = tmp_path / "runs" / "named"
    assert not (named / preflight.CLAIM_FILE).exists()
