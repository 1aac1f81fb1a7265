"""The local SuperLink check before `pubswap run` submits: a SuperLink started from another checkout's environment
(a fake one: a process that listens like flower-superlink, run as that venv's console script, in that checkout, with
its own variables) is found by its port and warned about with what differs and how to get one's own; one that
matches this command, or no SuperLink at all, is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import cli, superlink
from pubswap_flwr.cli import FlowerRunError
from pubswap_flwr.cli import main as pubswap

ROOT = Path(__file__).resolve().parents[2]
LISTENER = """import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").is_file(), reason="needs Linux /proc")


@pytest.fixture()
def other_superlink(tmp_path):
    """(port, checkout, its venv's bin): a fake SuperLink of another checkout's venv, stopped afterwards."""
    checkout = tmp_path / "other-checkout"
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    script = bin_dir / "flower-superlink"
    script.write_text(LISTENER)
    info = checkout / ".venv" / "lib" / "python3.12" / "site-packages" / "pubswap_flwr-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "direct_url.json").write_text(json.dumps({"url": f"file://{checkout}", "dir_info": {"editable": True}}))
    env = {"PATH": "/usr/bin:/bin", "PUBSWAP_OUTPUT_ROOT": str(checkout / "runs"), "FLWR_HOME": str(tmp_path / "home")}
    process = subprocess.Popen([str(bin_dir / "python"), str(script), "--insecure", "--simulation"], cwd=checkout,
                               env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        yield port, checkout, bin_dir
    finally:
        process.kill()
        process.wait(timeout=10)


def _ours(port: int, tmp_path: Path) -> dict[str, str]:
    return {superlink.PORT_ENV: str(port), superlink.NO_INSTALL_ENV: "1", "FLWR_HOME": str(tmp_path / "mine")}


def test_a_superlink_of_another_checkouts_environment_is_warned_about(other_superlink, tmp_path):
    port, checkout, bin_dir = other_superlink
    assert superlink.listener(port) is not None
    text = superlink.mismatch_warning(_ours(port, tmp_path), cwd=ROOT)
    assert text is not None
    lines = text.splitlines()
    assert lines[0].startswith(f"warning: the local SuperLink on 127.0.0.1:{port} (pid ")
    assert lines[0].endswith("which will run this app, was started from another checkout or environment:")
    assert f"  - environment: {bin_dir}, not this command's {Path(sys.executable).parent}: the app runs with that " \
           f"environment's Python packages and reads data/ (embedded models) from its pubswap-flwr install in " \
           f"{checkout}" in lines
    assert f"  - started in {checkout}, not {ROOT}: relative paths in the run config resolve there" in lines
    assert any(line.startswith("  - started without FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1") for line in lines)
    assert f"  - its FLWR_HOME is {tmp_path / 'home'}, not {tmp_path / 'mine'}" in lines
    assert f"  - PUBSWAP_OUTPUT_ROOT is '{checkout / 'runs'}' there, unset here" in lines
    assert lines[-1].startswith("  To give this checkout its own SuperLink: run `pubswap run` without "
                                "--shared-superlink and with FLWR_HOME, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT and "
                                "FLWR_LOCAL_CONTROL_API_PORT unset")


def test_pubswap_run_warns_before_it_submits(other_superlink, tmp_path, monkeypatch, capsys):
    port, checkout, _ = other_superlink
    monkeypatch.setenv(superlink.PORT_ENV, str(port))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "mine"))  # no config.toml: Flower's default connection is local
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # where pubswap run records the runs it submits
    submitted = []

    def submit(*args, **kwargs):
        submitted.append(capsys.readouterr().err)  # what was printed before the run was submitted
        raise FlowerRunError("not submitted in this test")

    monkeypatch.setattr(cli, "submit", submit)
    assert pubswap(["run", str(ROOT), "-c", "num-server-rounds=1", "--quiet"]) == 1
    assert len(submitted) == 1 and "was started from another checkout or environment" in submitted[0]
    assert f"started in {checkout}" in submitted[0]


def test_a_matching_superlink_or_none_is_not_warned_about(other_superlink, tmp_path):
    port, checkout, bin_dir = other_superlink
    same = {superlink.PORT_ENV: str(port), "PUBSWAP_OUTPUT_ROOT": str(checkout / "runs"),
            "FLWR_HOME": str(tmp_path / "home")}
    process = superlink.inspect(superlink.listener(port))
    assert superlink.differences(process, same, checkout, bin_dir) == [
        "started without FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1: every run installs the app's dependencies "
        "into a fresh environment first (~40 s, and it may swap torch)"]
    matching = superlink.Process(process.pid, process.argv, process.cwd,
                                 {**process.environ, superlink.NO_INSTALL_ENV: "1"})
    assert superlink.differences(matching, same, checkout, bin_dir) == []
    free = port
    while superlink.listener(free) is not None:  # a port nothing listens on: this command will start its own
        free += 1
    assert superlink.mismatch_warning(_ours(free, tmp_path), cwd=ROOT) is None


def test_which_connections_use_the_local_superlink(tmp_path):
    env = {"FLWR_HOME": str(tmp_path)}
    assert superlink.is_local_connection(None, env) and not superlink.is_local_connection("prod", env)
    (tmp_path / "config.toml").write_text('[superlink]\ndefault = "prod"\n[superlink.local]\naddress = ":local:"\n'
                                          '[superlink.prod]\naddress = "superlink.example.org:8000"\n')
    assert not superlink.is_local_connection(None, env)
    assert superlink.is_local_connection("local", env) and not superlink.is_local_connection("prod", env)
