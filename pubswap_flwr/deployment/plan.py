"""The deployment plan: the organizations' SuperNode specs, checked together with the SuperLink address, the
certificate and key files and the run's options, resolved to absolute paths, ports and node configs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .certificates import check_address_in_certificate
from .files import DeployError
from .keys import NAME_PATTERN, check_org_name

PROJECT = Path(__file__).resolve().parents[2]  # the Flower app directory (pyproject.toml)
DEFAULT_CONNECTION = "pubswap-deploy"
DEFAULT_NODE_PORT = 9094  # flower-supernode's default local Runtime API port; org i gets 9094 + i


@dataclass
class Org:
    """One organization's SuperNode: its key name, private data, state dir and optional model/task mix/port."""

    name: str
    data: str | None = None
    state_dir: str | None = None
    model: str | None = None
    task_mix: str | None = None
    port: int | None = None


def parse_superlink(address: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [addr]:port) -> (host, port)."""
    match = re.match(r"^\[([0-9A-Fa-f:.]+)\]:(\d+)$", address) or re.match(r"^([^:\s/]+):(\d+)$", address)
    if not match:
        raise DeployError(f"--superlink {address!r} must be HOST:PORT (no URL prefix), e.g. 127.0.0.1:8000")
    port = int(match.group(2))
    if not 0 < port < 65536:
        raise DeployError(f"--superlink port {port} is out of range")
    return match.group(1), port


def _toml_string(key: str, value: str) -> str:
    # Flower splits --node-config with a regex that knows no escapes, so quotes/backslashes cannot be represented.
    if any(c in value for c in '"\\\n'):
        raise DeployError(f"node-config {key} {value!r} contains a double quote, backslash or newline, which "
                          "Flower's --node-config parser cannot carry")
    return f'{key}="{value}"'


def absolute(path: str, what: str, must_exist: bool = False) -> Path:
    """`path` resolved to an absolute path; DeployError naming `what` when it must exist and does not."""
    resolved = Path(path).expanduser().resolve()
    if must_exist and not resolved.exists():
        raise DeployError(f"{what} {resolved} does not exist")
    return resolved


def node_config(org: Org, index: int) -> str:
    """The --node-config value for one organization (TOML key=value pairs, absolute paths)."""
    parts = []
    if org.data:
        parts.append(_toml_string("data-path", str(absolute(org.data, f"--data of {org.name}", must_exist=True))))
    if not org.state_dir:
        raise DeployError(f"organization {org.name} has no --state-dir (where its adapter, optimizer and counters "
                          "persist across rounds and restarts)")
    parts.append(_toml_string("state-dir", str(absolute(org.state_dir, f"--state-dir of {org.name}"))))
    if org.model:
        parts.append(_toml_string("model-name", org.model))
    if org.task_mix:
        parts.append(_toml_string("task-mix", org.task_mix))
    parts.append(f"partition-id={index}")
    return " ".join(parts)


@dataclass(frozen=True)
class DeploymentPlan:
    """Everything the printed commands need, checked: absolute paths, the address as dialled and bound, one
    SuperNode (name, key pair, port, node config) per organization, and the run's config overrides."""

    base: Path                              # the certificates and keys
    app_dir: Path
    connection: str
    address: str                            # HOST:PORT as the SuperNodes and the CLI dial it
    bind: str                               # the SuperLink's --host
    port: int
    orgs: list[Org]
    names: list[str]
    ports: list[int]                        # each SuperNode's local Runtime API port
    keys: dict[str, tuple[Path, Path]]      # organization -> (private key, public key)
    configs: list[str]                      # each SuperNode's --node-config
    overrides: list[str]                    # flwr run -c values

    @property
    def ca(self) -> Path:
        return self.base / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.base / "server.pem"

    @property
    def key(self) -> Path:
        return self.base / "server.key"


def _check_orgs(orgs: Sequence[Org], superlink_port: int) -> tuple[list[str], list[int]]:
    """The organizations' names and SuperNode ports, each distinct, neither reserved nor the SuperLink's."""
    names = [check_org_name(o.name) for o in orgs]
    if len(set(names)) != len(names):
        raise DeployError(f"organization names repeat: {names}")
    reserved = sorted(set(names) & {"superlink", "cli"})
    if reserved:
        raise DeployError(f"organization name {reserved[0]!r} is reserved (DIR/{reserved[0]}-home is used by the "
                          f"{reserved[0]}); choose another")
    ports = [o.port if o.port is not None else DEFAULT_NODE_PORT + i for i, o in enumerate(orgs)]
    if len(set(ports)) != len(ports):
        raise DeployError(f"SuperNode --port values repeat ({ports}); SuperNodes on one host need distinct ports")
    if superlink_port in ports:
        raise DeployError(f"SuperNode port {superlink_port} is the SuperLink's port")
    state_dirs = [str(absolute(o.state_dir, "--state-dir")) for o in orgs if o.state_dir]
    if len(set(state_dirs)) != len(state_dirs):
        raise DeployError("organizations share a --state-dir; each needs its own")
    return names, ports


def _check_files(base: Path, keys: dict[str, tuple[Path, Path]], host: str) -> None:
    """The certificates and every organization's key pair are in `base`, and the certificate names `host`."""
    ca, cert, key = base / "ca.crt", base / "server.pem", base / "server.key"
    missing = [str(p) for p in (ca, cert, key) if not p.is_file()]
    missing += [str(p) for pair in keys.values() for p in pair if not p.is_file()]
    if missing:
        raise DeployError(f"missing in {base}: {', '.join(missing)} (create them with `pubswap deploy certs "
                          f"--out {base}` and `pubswap deploy key --org NAME --out {base}`)")
    check_address_in_certificate(host, cert)


def _bind_address(host: str) -> str:
    """Where the SuperLink listens: loopback for a local address, every interface otherwise."""
    ipv6 = ":" in host
    if host in ("localhost", "127.0.0.1", "::1"):
        return "::1" if ipv6 else "127.0.0.1"
    return "::" if ipv6 else "0.0.0.0"


# parameters: `pubswap deploy`'s options, keyword-only with their defaults
def plan_deployment(directory: str | Path, superlink: str, orgs: Sequence[Org], *,
                    connection: str = DEFAULT_CONNECTION, app: str | Path = PROJECT,
                    run_config: Sequence[str] = (), output_dir: str | Path | None = None,
                    check_files: bool = True) -> DeploymentPlan:
    """Check a deployment's inputs together (DeployError on the first problem) and resolve them into a plan.
    `directory` holds the certificates and keys; with `check_files` they must be there."""
    if not orgs:
        raise DeployError("give at least one --org NAME --data PATH --state-dir PATH")
    if not NAME_PATTERN.match(connection):
        raise DeployError(f"connection name {connection!r} must be letters, digits, '.', '_' or '-'")
    base = absolute(str(directory), "--dir")
    host, port = parse_superlink(superlink)
    app_dir = absolute(str(app), "app directory", must_exist=True)
    if not (app_dir / "pyproject.toml").is_file():
        raise DeployError(f"app directory {app_dir} has no pyproject.toml")
    names, ports = _check_orgs(orgs, port)
    for value in run_config:
        if value.strip().endswith(".toml"):
            raise DeployError(f"run config {value!r}: flwr run accepts a TOML file only as its sole -c, and these "
                              "commands add output.dir; pass key=value overrides instead")
    keys = {o.name: (base / o.name, base / f"{o.name}.pub") for o in orgs}
    if check_files:
        _check_files(base, keys, host)
    configs = [node_config(o, i) for i, o in enumerate(orgs)]
    outputs = absolute(str(output_dir), "output dir") if output_dir else base / "runs"
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # as dialled: IPv6 in brackets
    return DeploymentPlan(base, app_dir, connection, address, _bind_address(host), port, list(orgs), names, ports,
                          keys, configs, [*run_config, f"output.dir='{outputs}'"])
