"""`pubswap deploy`: TLS certificates, SuperNode keys and the exact commands of a multi-organization Flower deployment.

    pubswap deploy certs --out DIR [--host NAME_OR_IP ...]     CA + SuperLink server certificate (SAN: localhost,
                                                               127.0.0.1 and every --host)
    pubswap deploy key --org NAME --out DIR                    an organization's SuperNode auth key pair (EC P-384,
                                                               OpenSSH format): DIR/NAME and DIR/NAME.pub
    pubswap deploy commands --dir DIR --superlink HOST:PORT \\
        --org NAME --data PATH --state-dir PATH [--model M] [--task-mix MIX] [--port P] ...
                                                               the SuperLink, registration, SuperNode, connection
                                                               and `flwr run` commands, with absolute paths

Which file goes where: ca.crt to every SuperNode and to the `flwr` CLI machine (`--root-certificates`,
`root-certificates` in config.toml); ca.crt, server.pem and server.key to the SuperLink machine only; ca.key stays
offline with whoever issues certificates; each organization keeps its private key NAME and sends NAME.pub to the
federation operator, who registers it with `flwr supernode register`. docs/deployment.md walks through it.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import re
import secrets
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PROJECT = Path(__file__).resolve().parents[1]  # the Flower app directory (pyproject.toml)
CERT_FILES = ("ca.crt", "ca.key", "server.pem", "server.key")
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
DEFAULT_CONNECTION = "pubswap-deploy"
DEFAULT_NODE_PORT = 9094  # flower-supernode's default local Runtime API port; org i gets 9094 + i
# The environment of every SuperNode. Its flower-superexec (started by the SuperNode with the SuperNode's environment;
# it launches one flwr-clientapp per message) looks for a new message every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds,
# 1.0 by default and 0.01-60 accepted (flwr/supercore/superexec/run_superexec.py, _get_task_poll_interval): 0.2 s
# takes 0.4 s of average wait off every message for five local requests a second. docs/deployment.md, "Latency".
SUPERNODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"}
CURVE = ec.SECP384R1  # NIST P-384: Flower accepts NIST curves only for SuperNode auth keys
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DNS_PATTERN = re.compile(r"^(?=.{1,253}$)(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                         r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


class DeployError(RuntimeError):
    """A deployment helper could not do what was asked (bad argument, unwritable directory, existing file...)."""


# --- files -------------------------------------------------------------------------------------------------------


def _output_dir(out: str | Path) -> Path:
    """`out` as an absolute, existing, writable directory. A missing one is created owner-only (0700; parents it
    needs get the default mode); an existing one is used as it is, with its mode unchanged."""
    directory = Path(out).expanduser().resolve()
    if directory.exists() and not directory.is_dir():
        raise DeployError(f"output path {directory} exists and is not a directory")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as err:
        raise DeployError(f"cannot create output directory {directory}: {err.strerror or err}") from err
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DeployError(f"output directory {directory} is not writable")
    return directory


def _refuse_existing(paths: Sequence[Path], force: bool) -> None:
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing and not force:
        raise DeployError(f"refusing to overwrite existing file(s): {', '.join(existing)} (use --force to replace "
                          "them; anything signed by or registered with the old ones stops working)")


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write `data` to `path` atomically: into a new temporary file in the same directory, created with its final
    mode (0600 for private files, 0644 otherwise) so a private key is never readable by others, not even while it
    is written, then renamed over `path`. An existing file (or symlink) at `path` is replaced, never written
    into, so its old mode or other hard links to it cannot expose the new content."""
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)  # exactly `mode`, whatever the umask
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise DeployError(f"cannot write {path}: {err.strerror or err}") from err


# --- certificates ------------------------------------------------------------------------------------------------


def san_entries(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """subjectAltName entries: localhost, 127.0.0.1 and every host (IP addresses as IPAddress, names as DNSName),
    without duplicates, in order."""
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for raw in [*DEFAULT_HOSTS, *hosts]:
        host = raw.strip()
        if host.startswith("[") and host.endswith("]"):  # [::1] as written in addresses
            host = host[1:-1]
        if not host:
            raise DeployError("empty --host value")
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
            key = str(ipaddress.ip_address(host))
        except ValueError:
            if not DNS_PATTERN.match(host):
                raise DeployError(f"--host {raw!r} is neither an IP address nor a valid DNS name") from None
            entry = x509.DNSName(host.lower())
            key = host.lower()
        if key not in seen:
            seen.add(key)
            names.append(entry)
    return names


def certificate_names(cert_path: Path) -> list[str]:
    """The subjectAltName entries (DNS names and IP addresses) of a PEM certificate, as text."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as err:
        raise DeployError(f"cannot read the certificate {cert_path}: {err}") from err
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(a) for a in san.get_values_for_type(x509.IPAddress))]


def _matches(host: str, name: str) -> bool:
    """TLS host name matching (RFC 6125): IP addresses compare as addresses, names case-insensitively, and a
    leading `*.` covers exactly one label."""
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(name)
    except ValueError:
        pass
    host, name = host.lower().rstrip("."), name.lower().rstrip(".")
    if name.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == name[2:]
    return host == name


def check_address_in_certificate(host: str, cert_path: Path) -> None:
    """SuperNodes and the flwr CLI verify the SuperLink's certificate against the address they dial: refuse to
    print commands for an address the certificate does not name."""
    names = certificate_names(cert_path)
    if not any(_matches(host, name) for name in names):
        raise DeployError(f"--superlink host {host!r} is not in {cert_path.name}'s subjectAltName "
                          f"({', '.join(names) or 'none'}): TLS clients would refuse the connection; use one of those names, or "
                          f"reissue the certificates with `pubswap deploy certs --out {cert_path.parent} --host {host} "
                          "--force` and hand out the new ca.crt")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pubswap-flwr"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def build_certificates(hosts: Sequence[str] = (), days: int = 365) -> dict[str, bytes]:
    """A CA (EC P-384 key, self-signed) and a SuperLink server certificate signed by it, as PEM bytes keyed by
    file name (ca.crt, ca.key, server.pem, server.key)."""
    if days < 1:
        raise DeployError(f"--days must be at least 1, got {days}")
    sans = san_entries(hosts)
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)  # tolerate clock skew
    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(CURVE())
    ca_name = _name("pubswap-flwr deployment CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(CURVE())
    first = hosts[0].strip().strip("[]") if hosts else "localhost"
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"pubswap-flwr SuperLink {first}")).issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    pem_key = dict(encoding=serialization.Encoding.PEM, format=serialization.PrivateFormat.PKCS8,
                   encryption_algorithm=serialization.NoEncryption())
    return {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "ca.key": ca_key.private_bytes(**pem_key),
        "server.pem": server_cert.public_bytes(serialization.Encoding.PEM),
        "server.key": server_key.private_bytes(**pem_key),
    }


def make_certs(out: str | Path, hosts: Sequence[str] = (), *, days: int = 365, force: bool = False) -> dict[str, Path]:
    """Write ca.crt, ca.key, server.pem, server.key into `out` (keys mode 0600); returns name -> path."""
    files = build_certificates(hosts, days)  # validates the hosts before anything is created
    directory = _output_dir(out)
    paths = {name: directory / name for name in CERT_FILES}
    _refuse_existing(list(paths.values()), force)
    for name, data in files.items():
        _write(paths[name], data, private=name.endswith(".key"))
    return paths


# --- SuperNode auth keys -----------------------------------------------------------------------------------------


def check_org_name(org: str) -> str:
    if not NAME_PATTERN.match(org or ""):
        raise DeployError(f"organization name {org!r} must be 1-64 letters, digits, '.', '_' or '-' and start with "
                          "a letter or digit (it becomes a file name)")
    return org


def make_org_key(org: str, out: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """An EC P-384 key pair in OpenSSH format: `out/org` (private, 0600) and `out/org.pub` ("ecdsa-sha2-nistp384
    ... org"), as `flower-supernode --auth-supernode-private-key` and `flwr supernode register` read them."""
    check_org_name(org)
    directory = _output_dir(out)
    private_path, public_path = directory / org, directory / f"{org}.pub"
    _refuse_existing([private_path, public_path], force)
    key = ec.generate_private_key(CURVE())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(private_path, private, private=True)
    _write(public_path, public + b" " + org.encode() + b"\n", private=False)
    return private_path, public_path


# --- commands ----------------------------------------------------------------------------------------------------


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


def _absolute(path: str, what: str, must_exist: bool = False) -> Path:
    resolved = Path(path).expanduser().resolve()
    if must_exist and not resolved.exists():
        raise DeployError(f"{what} {resolved} does not exist")
    return resolved


def node_config(org: Org, index: int) -> str:
    """The --node-config value for one organization (TOML key=value pairs, absolute paths)."""
    parts = []
    if org.data:
        parts.append(_toml_string("data-path", str(_absolute(org.data, f"--data of {org.name}", must_exist=True))))
    if not org.state_dir:
        raise DeployError(f"organization {org.name} has no --state-dir (where its adapter, optimizer and counters "
                          "persist across rounds and restarts)")
    parts.append(_toml_string("state-dir", str(_absolute(org.state_dir, f"--state-dir of {org.name}"))))
    if org.model:
        parts.append(_toml_string("model-name", org.model))
    if org.task_mix:
        parts.append(_toml_string("task-mix", org.task_mix))
    parts.append(f"partition-id={index}")
    return " ".join(parts)


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


def deployment_commands(directory: str | Path, superlink: str, orgs: Sequence[Org], *,
                        connection: str = DEFAULT_CONNECTION, app: str | Path = PROJECT,
                        run_config: Sequence[str] = (), output_dir: str | Path | None = None,
                        check_files: bool = True) -> str:
    """The walkthrough as shell text: SuperLink, CLI connection, registration, one SuperNode per organization,
    `flwr run` and the status check. Every path is absolute; `directory` holds the certificates and keys."""
    if not orgs:
        raise DeployError("give at least one --org NAME --data PATH --state-dir PATH")
    if not NAME_PATTERN.match(connection):
        raise DeployError(f"connection name {connection!r} must be letters, digits, '.', '_' or '-'")
    base = _absolute(str(directory), "--dir")
    host, port = parse_superlink(superlink)
    app_dir = _absolute(str(app), "app directory", must_exist=True)
    if not (app_dir / "pyproject.toml").is_file():
        raise DeployError(f"app directory {app_dir} has no pyproject.toml")
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
    if port in ports:
        raise DeployError(f"SuperNode port {port} is the SuperLink's port")
    state_dirs = [str(_absolute(o.state_dir, "--state-dir")) for o in orgs if o.state_dir]
    if len(set(state_dirs)) != len(state_dirs):
        raise DeployError("organizations share a --state-dir; each needs its own")
    for value in run_config:
        if value.strip().endswith(".toml"):
            raise DeployError(f"run config {value!r}: flwr run accepts a TOML file only as its sole -c, and these "
                              "commands add output.dir; pass key=value overrides instead")
    ca, cert, key = base / "ca.crt", base / "server.pem", base / "server.key"
    keys = {o.name: (base / o.name, base / f"{o.name}.pub") for o in orgs}
    if check_files:
        missing = [str(p) for p in (ca, cert, key) if not p.is_file()]
        missing += [str(p) for pair in keys.values() for p in pair if not p.is_file()]
        if missing:
            raise DeployError(f"missing in {base}: {', '.join(missing)} (create them with `pubswap deploy certs "
                              f"--out {base}` and `pubswap deploy key --org NAME --out {base}`)")
        check_address_in_certificate(host, cert)
    configs = [node_config(o, i) for i, o in enumerate(orgs)]
    outputs = _absolute(str(output_dir), "output dir") if output_dir else base / "runs"
    ipv6 = ":" in host
    address = f"[{host}]:{port}" if ipv6 else f"{host}:{port}"  # as dialled: IPv6 in brackets
    if host in ("localhost", "127.0.0.1", "::1"):
        bind = "::1" if ipv6 else "127.0.0.1"
    else:
        bind = "::" if ipv6 else "0.0.0.0"
    cli_home = base / "cli-home"
    overrides = [*run_config, f"output.dir='{outputs}'"]

    out = [
        f"# pubswap-flwr deployment: one SuperLink at {address}, {len(orgs)} organization(s): "
        f"{', '.join(names)}.",
        "# Every shell: the project's environment (flower-superlink, flower-supernode and flwr on PATH), e.g.",
        f"#   source {shlex.quote(str(app_dir / '.venv' / 'bin' / 'activate'))}",
        "",
        "# 1. SuperLink (server machine, terminal 1). Needs ca.crt, server.pem, server.key. One HTTPS port serves",
        "#    the Fleet, Control and Runtime APIs; runtime dependency installation (uv sync per run) is off.",
        _command(["flower-superlink"], ["--ssl-ca-certfile", str(ca)], ["--ssl-certfile", str(cert)],
                 ["--ssl-keyfile", str(key)], ["--enable-supernode-auth"], ["--host", bind, "--port", str(port)],
                 ["--database", str(base / "superlink.db")], ["--disable-runtime-dependency-installation"],
                 env={"FLWR_HOME": str(base / "superlink-home")}),
        "",
        "# 2. The flwr CLI's connection (operator shell). Needs ca.crt only.",
        f"export FLWR_HOME={shlex.quote(str(cli_home))}",
        'mkdir -p "$FLWR_HOME"',
        "cat >> \"$FLWR_HOME/config.toml\" <<'EOF'",
        f"[superlink.{connection}]",
        f"address = {json.dumps(address)}",
        f"root-certificates = {json.dumps(str(ca))}",
        "EOF",
        "",
        "# 3. Register each organization's public key (operator shell, SuperLink running).",
    ]
    for org in orgs:
        out.append(_command(["flwr", "supernode", "register", str(keys[org.name][1]), connection, "--name",
                             org.name]))
    out.append(f"flwr supernode list {connection}")
    for i, (org, config) in enumerate(zip(orgs, configs)):
        out += [
            "",
            f"# {4 + i}. {org.name}'s SuperNode ({org.name}'s machine, terminal {2 + i}). Needs ca.crt and its "
            f"private key {org.name}.",
            _command(["flower-supernode"], ["--superlink", address], ["--root-certificates", str(ca)],
                     ["--auth-supernode-private-key", str(keys[org.name][0])], ["--port", str(ports[i])],
                     ["--node-config", config],
                     env={"FLWR_HOME": str(base / f"{org.name}-home"), **SUPERNODE_ENV}),
        ]
    step = 4 + len(orgs)
    out += [
        "",
        f"# {step}. Start the run (operator shell, FLWR_HOME as in step 2). `flwr run --stream` exits 0 even when "
        "the run fails:",
        f"#    check the run's status with step {step + 1}.",
        f"cd {shlex.quote(str(app_dir))}",
        _command(["flwr", "run", ".", connection, "--stream"], *[["-c", o] for o in overrides]),
        "",
        f"# {step + 1}. Status (finished:completed / finished:failed with status-details), and the SuperNodes.",
        f"flwr ls {connection} --format json",
        f"flwr supernode list {connection}",
        "",
    ]
    return "\n".join(out)


# --- argparse ----------------------------------------------------------------------------------------------------


class _OrgStart(argparse.Action):
    """--org NAME starts a new organization; the per-organization options that follow attach to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        orgs = list(getattr(namespace, "orgs", None) or [])
        orgs.append(Org(str(values)))
        namespace.orgs = orgs


class _OrgField(argparse.Action):
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
