"""The deployment walkthrough as shell text: SuperLink, CLI connection, key registration, one SuperNode per
organization, `flwr run` and the status check, with readable quoting."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Sequence

from .plan import DEFAULT_CONNECTION, PROJECT, DeploymentPlan, Org, plan_deployment

# The environment of every SuperNode. Its flower-superexec (started by the SuperNode with the SuperNode's environment;
# it launches one flwr-clientapp per message) looks for a new message every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds,
# 1.0 by default and 0.01-60 accepted (flwr/supercore/superexec/run_superexec.py, _get_task_poll_interval): 0.2 s
# takes 0.4 s of average wait off every message for five local requests a second. docs/deployment.md, "Latency".
SUPERNODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"}


def _quote(word: str) -> str:
    """Shell quoting that stays readable: bare when safe, '...' or "..." when that needs no escapes."""
    if shlex.quote(word) == word:
        return word
    if "'" not in word:
        return f"'{word}'"
    if not any(c in word for c in '"$`\\!'):
        return f'"{word}"'
    return shlex.quote(word)


def _command(*segments: Sequence[str], env: dict[str, str] | None = None) -> str:
    """One shell command; each segment (the program and its positionals, then option + value groups) on its own
    line, joined with backslash continuations."""
    prefix = [f"{k}={_quote(v)}" for k, v in (env or {}).items()]
    lines = [" ".join(prefix + [_quote(w) for w in segments[0]])]
    lines += [" ".join(_quote(w) for w in segment) for segment in segments[1:]]
    return " \\\n    ".join(lines)


def _superlink_steps(plan: DeploymentPlan) -> list[str]:
    """The header, step 1 (the SuperLink), step 2 (the CLI's connection) and step 3 (key registration)."""
    bind_host, base, connection = plan.bind, plan.base, plan.connection
    out = [
        f"# pubswap-flwr deployment: one SuperLink at {plan.address}, {len(plan.orgs)} organization(s): "
        f"{', '.join(plan.names)}.",
        "# Every shell: the project's environment (flower-superlink, flower-supernode and flwr on PATH), e.g.",
        f"#   source {shlex.quote(str(plan.app_dir / '.venv' / 'bin' / 'activate'))}",
        "",
        "# 1. SuperLink (server machine, terminal 1). Needs ca.crt, server.pem, server.key. One HTTPS port serves",
        "#    the Fleet, Control and Runtime APIs; runtime dependency installation (uv sync per run) is off.",
        _command(["flower-superlink"], ["--ssl-ca-certfile", str(plan.ca)], ["--ssl-certfile", str(plan.cert)],
                 ["--ssl-keyfile", str(plan.key)], ["--enable-supernode-auth"],
                 ["--host", bind_host, "--port", str(plan.port)],
                 ["--database", str(base / "superlink.db")], ["--disable-runtime-dependency-installation"],
                 env={"FLWR_HOME": str(base / "superlink-home")}),
        "",
        "# 2. The flwr CLI's connection (operator shell). Needs ca.crt only.",
        f"export FLWR_HOME={shlex.quote(str(base / 'cli-home'))}",
        'mkdir -p "$FLWR_HOME"',
        "cat >> \"$FLWR_HOME/config.toml\" <<'EOF'",
        f"[superlink.{connection}]",
        f"address = {json.dumps(plan.address)}",
        f"root-certificates = {json.dumps(str(plan.ca))}",
        "EOF",
        "",
        "# 3. Register each organization's public key (operator shell, SuperLink running).",
    ]
    for org in plan.orgs:
        out.append(_command(["flwr", "supernode", "register", str(plan.keys[org.name][1]), connection, "--name",
                             org.name]))
    out.append(f"flwr supernode list {connection}")
    return out


def _supernode_steps(plan: DeploymentPlan) -> list[str]:
    """Steps 4...: one SuperNode per organization, on its own machine."""
    out: list[str] = []
    for i, (org, config) in enumerate(zip(plan.orgs, plan.configs)):
        out += [
            "",
            f"# {4 + i}. {org.name}'s SuperNode ({org.name}'s machine, terminal {2 + i}). Needs ca.crt and its "
            f"private key {org.name}.",
            _command(["flower-supernode"], ["--superlink", plan.address], ["--root-certificates", str(plan.ca)],
                     ["--auth-supernode-private-key", str(plan.keys[org.name][0])], ["--port", str(plan.ports[i])],
                     ["--node-config", config],
                     env={"FLWR_HOME": str(plan.base / f"{org.name}-home"), **SUPERNODE_ENV}),
        ]
    return out


def _run_steps(plan: DeploymentPlan) -> list[str]:
    """The last two steps: `flwr run`, then the run's status and the SuperNodes."""
    step, connection = 4 + len(plan.orgs), plan.connection
    return [
        "",
        f"# {step}. Start the run (operator shell, FLWR_HOME as in step 2). `flwr run --stream` exits 0 even when "
        "the run fails:",
        f"#    check the run's status with step {step + 1}.",
        f"cd {shlex.quote(str(plan.app_dir))}",
        _command(["flwr", "run", ".", connection, "--stream"], *[["-c", o] for o in plan.overrides]),
        "",
        f"# {step + 1}. Status (finished:completed / finished:failed with status-details), and the SuperNodes.",
        f"flwr ls {connection} --format json",
        f"flwr supernode list {connection}",
        "",
    ]


# parameters: `pubswap deploy`'s options, keyword-only with their defaults
def deployment_commands(directory: str | Path, superlink: str, orgs: Sequence[Org], *,
                        connection: str = DEFAULT_CONNECTION, app: str | Path = PROJECT,
                        run_config: Sequence[str] = (), output_dir: str | Path | None = None,
                        check_files: bool = True) -> str:
    """The walkthrough as shell text: SuperLink, CLI connection, registration, one SuperNode per organization,
    `flwr run` and the status check. Every path is absolute; `directory` holds the certificates and keys."""
    plan = plan_deployment(directory, superlink, orgs, connection=connection, app=app, run_config=run_config,
                           output_dir=output_dir, check_files=check_files)
    return "\n".join(_superlink_steps(plan) + _supernode_steps(plan) + _run_steps(plan))
