"""`pubswap deploy certs | key | commands`: the argparse front of the deployment helpers (--org NAME starts an
organization; the options after it describe it)."""

from __future__ import annotations

import argparse
import sys

from .certificates import make_certs, san_entries
from .commands import deployment_commands
from .files import DeployError
from .keys import make_org_key
from .plan import DEFAULT_CONNECTION, DEFAULT_NODE_PORT, PROJECT, Org


class _OrgStart(argparse.Action):
    """--org NAME starts a new organization; the per-organization options that follow attach to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        orgs = list(getattr(namespace, "orgs", None) or [])
        orgs.append(Org(str(values)))
        namespace.orgs = orgs


class _OrgField(argparse.Action):
    """--data, --state-dir, --model, --task-mix, --port: set on the organization the last --org started."""

    def __call__(self, parser, namespace, values, option_string=None):
        orgs = getattr(namespace, "orgs", None) or []
        if not orgs:
            parser.error(f"{option_string} must follow an --org NAME")
        current = orgs[-1]
        if getattr(current, self.dest) is not None:
            parser.error(f"{option_string} given twice for organization {current.name}")
        setattr(current, self.dest, values)


def cmd_certs(args: argparse.Namespace) -> int:
    paths = make_certs(args.out, args.host or [], days=args.days, force=args.force)
    sans = ", ".join(str(n.value) for n in san_entries(args.host or []))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(f"server certificate subjectAltName: {sans}")
    print("ca.crt -> every SuperNode and the flwr CLI (root-certificates); ca.crt, server.pem, server.key -> the "
          "SuperLink; keep ca.key offline.")
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    private, public = make_org_key(args.org, args.out, force=args.force)
    print(f"wrote {private} (private: stays with {args.org}'s SuperNode) and {public} (register it with "
          f"`flwr supernode register {public} <connection>`)")
    return 0


def cmd_commands(args: argparse.Namespace) -> int:
    print(deployment_commands(args.dir, args.superlink, args.orgs or [], connection=args.connection, app=args.app,
                              run_config=args.run_config or [], output_dir=args.output_dir,
                              check_files=not args.no_check), end="")
    return 0


def _guarded(func):
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except DeployError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return run


def register(sub) -> None:
    """Add `pubswap deploy certs | key | commands` to the `pubswap` parser's subcommands."""
    deploy = sub.add_parser("deploy", help="certificates, SuperNode keys and commands for a real deployment")
    actions = deploy.add_subparsers(dest="deploy_command", required=True)

    certs = actions.add_parser("certs", help="a CA and a SuperLink TLS certificate signed by it")
    certs.add_argument("--out", required=True, help="directory for ca.crt, ca.key, server.pem, server.key")
    certs.add_argument("--host", action="append", metavar="NAME_OR_IP",
                       help="a name or IP address the SuperLink is reached at (repeatable; localhost and "
                            "127.0.0.1 are always included)")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    certs.add_argument("--force", action="store_true", help="overwrite existing files")
    certs.set_defaults(func=_guarded(cmd_certs))

    key = actions.add_parser("key", help="an organization's SuperNode auth key pair (EC P-384, OpenSSH format)")
    key.add_argument("--org", required=True, help="organization name (file names NAME and NAME.pub)")
    key.add_argument("--out", required=True, help="directory for the key pair")
    key.add_argument("--force", action="store_true", help="overwrite an existing key pair")
    key.set_defaults(func=_guarded(cmd_key))

    commands = actions.add_parser(
        "commands", help="print the SuperLink, registration, SuperNode and flwr run commands",
        description="Per organization: --org NAME followed by its own --data, --state-dir and optional --model, "
                    "--task-mix, --port.")
    commands.add_argument("--dir", required=True, help="directory with ca.crt, server.pem, server.key and the "
                                                       "organizations' keys NAME, NAME.pub")
    commands.add_argument("--superlink", required=True, help="HOST:PORT the SuperNodes and the CLI reach the "
                                                             "SuperLink at (must be in the certificate's SAN: "
                                                             "checked)")
    commands.add_argument("--org", action=_OrgStart, dest="orgs", metavar="NAME", help="start an organization")
    commands.add_argument("--data", action=_OrgField, dest="data", metavar="PATH",
                          help="its private JSONL/parquet data (node-config data-path)")
    commands.add_argument("--state-dir", action=_OrgField, dest="state_dir", metavar="PATH",
                          help="where its node state persists (node-config state-dir)")
    commands.add_argument("--model", action=_OrgField, dest="model", metavar="NAME",
                          help="its model (node-config model-name; default: the run's model.name)")
    commands.add_argument("--task-mix", action=_OrgField, dest="task_mix", metavar="MIX",
                          help="its generated-task mix when it has no data (node-config task-mix)")
    commands.add_argument("--port", action=_OrgField, dest="port", type=int, metavar="PORT",
                          help=f"its SuperNode's local Runtime API port (default {DEFAULT_NODE_PORT} + index)")
    commands.add_argument("--connection", default=DEFAULT_CONNECTION, help="connection name in config.toml")
    commands.add_argument("--app", default=str(PROJECT), help="the Flower app directory (default: this project)")
    commands.add_argument("--output-dir", help="the run's output.dir (default: DIR/runs)")
    commands.add_argument("-c", "--run-config", action="append", metavar="KEY=VALUE ...",
                          help="run-config overrides for flwr run (repeatable)")
    commands.add_argument("--no-check", action="store_true", help="do not require the certificate and key files")
    commands.set_defaults(func=_guarded(cmd_commands), orgs=None)
