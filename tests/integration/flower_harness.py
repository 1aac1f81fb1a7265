"""Hermetic Flower for tests and benchmarks: `flwr run` on a private local SuperLink (simulation runtime), and a real
localhost deployment (TLS SuperLink with node authentication, one SuperNode per organization); status checked with
`flwr ls`, and every process started stopped by PID afterwards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pubswap_flwr import deployment
from pubswap_flwr.cli import flower_env, flwr_executable, submit, wait
from pubswap_flwr.node.warm.client import RUNTIME_DIR_ENV
from tests.processes import alive, descendants, stop_pids
from tests.processes import process_table as _processes

PROJECT = Path(__file__).resolve().parents[2]
CONNECTION = "pubswap-test"
ORGS = {"org-a": PROJECT / "data" / "samples" / "org-a.jsonl", "org-b": PROJECT / "data" / "samples" / "org-b.jsonl"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalFlower:
    """`flwr run` against a private managed local SuperLink (simulation runtime)."""

    def __init__(self, root: Path):
        self.root = root
        self.http_port = free_port()
        self.control_port = free_port()
        self.env = flower_env({
            "FLWR_HOME": str(root / "flwr-home"),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
        })

    def run(self, overrides: list[str], nodes: int = 2, timeout: float = 900) -> dict:
        """Submit `flwr run <project>` with run-config overrides (one -c each) and wait; returns the `flwr ls` row."""
        run_id = submit(PROJECT, overrides, f"num-supernodes={nodes} client-resources-num-cpus=1", self.env)
        row = wait(run_id, self.env, poll=2.0, timeout=timeout)  # tests: fast, not the back-off
        row["run-id"] = run_id
        return row

    def close(self) -> None:
        table = _processes()
        roots = [pid for pid, (_, cmd) in table.items()
                 if "flower-superlink" in cmd and str(self.http_port) in cmd]
        pids = [p for root in roots for p in descendants(root, table)] + roots
        stop_pids(pids)


@dataclass
class Deployment:
    """Processes and paths of one localhost deployment (all under `root`)."""

    root: Path
    superlink_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)  # label -> process (restarts relabelled)
    node_ports: dict[str, int] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)  # every PID started here or below a process started here

    @property
    def keys(self) -> Path:
        return self.root / "deploy"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.superlink_port}"

    def env(self, home: str) -> dict[str, str]:
        # No telemetry (offline machine: a SuperNode would wait 4 s for it before deactivating on SIGTERM), and one
        # torch thread per process: two organizations share this machine's cores.
        # The warm workers of this deployment keep their sockets under its root, so teardown finds them by path.
        return flower_env({"FLWR_HOME": str(self.root / home), "FLWR_TELEMETRY_ENABLED": "0",
                           "OMP_NUM_THREADS": "1", RUNTIME_DIR_ENV: str(self.root / "w")})

    @property
    def cli_env(self) -> dict[str, str]:
        return self.env("cli-home")

    def state_dir(self, org: str) -> Path:
        return self.root / "state" / org

    def start(self, label: str, args: list[str], home: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.root / "logs" / f"{label}.log").open("ab")
        proc = subprocess.Popen(args, env={**self.env(home), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.root, start_new_session=True)
        log.close()
        self.processes[label] = proc
        self.seen.add(proc.pid)
        return proc

    def log(self, label: str, tail: int = 3000) -> str:
        path = self.root / "logs" / f"{label}.log"
        return path.read_text(errors="replace")[-tail:] if path.is_file() else ""

    def start_supernode(self, org: str, label: str | None = None) -> subprocess.Popen:
        index = list(ORGS).index(org) if org in ORGS else len(ORGS)
        config = deployment.node_config(deployment.Org(org, data=str(ORGS[org]) if org in ORGS else None,
                                               state_dir=str(self.state_dir(org))), index)
        port = self.node_ports.setdefault(org, free_port())
        args = [flwr_executable("flower-supernode"), "--superlink", self.address,
                "--root-certificates", str(self.keys / "ca.crt"),
                "--auth-supernode-private-key", str(self.keys / org), "--port", str(port), "--node-config", config]
        return self.start(label or org, args, f"{org}-home", deployment.SUPERNODE_ENV)  # as `pubswap deploy commands`

    def launch(self, unregistered: tuple[str, ...] = ()) -> "Deployment":
        """Certificates and keys, a TLS SuperLink with node authentication, the CLI connection, ORGS registered and
        their SuperNodes started; `unregistered` orgs get a key and a SuperNode but no registration."""
        (self.root / "logs").mkdir(exist_ok=True)
        deployment.make_certs(self.keys)
        for org in [*ORGS, *unregistered]:
            deployment.make_org_key(org, self.keys)
        superlink = self.start("superlink", [
            flwr_executable("flower-superlink"), "--ssl-ca-certfile", str(self.keys / "ca.crt"),
            "--ssl-certfile", str(self.keys / "server.pem"), "--ssl-keyfile", str(self.keys / "server.key"),
            "--enable-supernode-auth", "--host", "127.0.0.1", "--port", str(self.superlink_port),
            "--database", str(self.root / "superlink.db"), "--disable-runtime-dependency-installation"],
            "superlink-home")
        wait_for_port(self.superlink_port, superlink, 90, "flower-superlink", self.log("superlink"))
        home = self.root / "cli-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink.{CONNECTION}]\naddress = "{self.address}"\nroot-certificates = "{self.keys / "ca.crt"}"\n')
        for org in ORGS:
            self.node_ids[org] = register(self, org)
        for org in [*unregistered, *ORGS]:
            self.start_supernode(org)
        return self

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([flwr_executable(), *args], env=self.cli_env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def track(self) -> None:
        """Remember every current descendant of the processes started here (children of a SuperNode outlive it)."""
        table = _processes()
        for proc in self.processes.values():
            self.seen.update(descendants(proc.pid, table))

    def markers(self) -> list[str]:
        ports = [self.superlink_port, *self.node_ports.values()]
        return [str(self.root)] + [f"127.0.0.1:{p}" for p in ports]

    def leftovers(self) -> dict[int, str]:
        """Live processes that belong to this deployment: started here, below one, or naming its ports/paths."""
        table = _processes()
        ours = {pid for pid in self.seen if pid in table}
        for root in list(ours):
            ours.update(descendants(root, table))
        markers = self.markers()
        ours.update(pid for pid, (_, cmd) in table.items()
                    if pid != os.getpid() and any(m in cmd for m in markers))
        return {pid: table[pid][1] for pid in ours if alive(pid)}

    def stop(self, pids: list[int]) -> None:
        stop_pids(pids)
        for proc in self.processes.values():
            if proc.pid in pids:
                proc.wait(timeout=10)

    def close(self) -> dict[int, str]:
        self.track()
        for _ in range(3):
            left = self.leftovers()
            if not left:
                break
            self.stop(sorted(left))
            time.sleep(0.5)
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.wait(timeout=10)
        return self.leftovers()


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float, what: str, log: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode} before listening:\n{log}")
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise AssertionError(f"{what} did not listen on port {port} within {timeout:.0f} s")


def register(dep: Deployment, org: str) -> int:
    done = dep.flwr("supernode", "register", str(dep.keys / f"{org}.pub"), CONNECTION, "--name", org,
                    "--format", "json")
    assert done.returncode == 0, f"flwr supernode register {org} failed: {done.stdout} {done.stderr}"
    reply = json.loads(done.stdout[done.stdout.index("{"):])
    assert reply.get("success"), reply
    return int(reply["node-id"])
