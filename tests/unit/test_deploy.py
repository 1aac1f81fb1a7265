"""`pubswap deploy`: certificate SANs and CA signature, a real TLS handshake with the files, OpenSSH EC keys that
Flower's own loaders accept, refusal to overwrite, and the printed commands (flags, absolute paths, shell syntax)."""

from __future__ import annotations

import ipaddress
import os
import shlex
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key, load_ssh_public_key

from pubswap_flwr import deployment
from pubswap_flwr.cli import main

PROJECT = Path(__file__).resolve().parents[2]
SAMPLES = PROJECT / "data" / "samples"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return deployment.make_certs(tmp_path_factory.mktemp("certs"), ["superlink.example.org", "10.1.2.3", "[::1]"])


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_server_certificate_covers_localhost_loopback_and_every_host(certs):
    san = _cert(certs["server.pem"]).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "superlink.example.org"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address(a)
                                                            for a in ("127.0.0.1", "10.1.2.3", "::1")}


def test_server_certificate_is_signed_by_the_ca_and_matches_its_key(certs):
    ca, server = _cert(certs["ca.crt"]), _cert(certs["server.pem"])
    server.verify_directly_issued_by(ca)  # raises on a wrong issuer or signature
    ca.verify_directly_issued_by(ca)  # self-signed
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usage
    server_key = load_pem_private_key(certs["server.key"].read_bytes(), None)
    ca_key = load_pem_private_key(certs["ca.key"].read_bytes(), None)
    assert server_key.public_key().public_numbers() == server.public_key().public_numbers()
    assert ca_key.public_key().public_numbers() == ca.public_key().public_numbers()


def test_private_keys_are_owner_only(certs):
    for name, path in certs.items():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if name.endswith(".key") else 0o644), (name, oct(mode))


def _handshake(certs: dict[str, Path], server_hostname: str) -> None:
    """A TLS handshake in memory: server with server.pem/server.key, client trusting only ca.crt."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs["server.pem"], certs["server.key"])
    client_ctx = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    bios = [ssl.MemoryBIO() for _ in range(4)]
    server = server_ctx.wrap_bio(bios[0], bios[1], server_side=True)
    client = client_ctx.wrap_bio(bios[2], bios[3], server_hostname=server_hostname)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        bios[0].write(bios[3].read())  # client -> server
        bios[2].write(bios[1].read())  # server -> client
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "superlink.example.org", "10.1.2.3"])
def test_tls_handshake_verifies_for_every_san(certs, name):
    _handshake(certs, name)


def test_tls_handshake_fails_for_a_name_outside_the_certificate(certs):
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, "elsewhere.example.org")


def test_refuses_to_overwrite_certificates_unless_forced(tmp_path):
    first = deployment.make_certs(tmp_path)
    before = first["ca.crt"].read_bytes()
    with pytest.raises(deployment.DeployError, match="refusing to overwrite.*ca.crt.*--force"):
        deployment.make_certs(tmp_path)
    assert first["ca.crt"].read_bytes() == before
    deployment.make_certs(tmp_path, force=True)
    assert first["ca.crt"].read_bytes() != before


@pytest.mark.parametrize("host", ["bad host", "under_score.example", "-leading.example", ""])
def test_invalid_host_names_are_rejected(tmp_path, host):
    with pytest.raises(deployment.DeployError, match="host"):
        deployment.make_certs(tmp_path, [host])
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_output_directory_errors_name_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(deployment.DeployError, match="is not a directory"):
        deployment.make_certs(blocker)
    with pytest.raises(deployment.DeployError, match="cannot create output directory"):
        deployment.make_org_key("org-a", blocker / "keys")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_directory_is_an_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(deployment.DeployError, match="not writable"):
        deployment.make_org_key("org-a", locked)


def test_org_key_is_an_openssh_ec_p384_pair(tmp_path):
    private_path, public_path = deployment.make_org_key("org-a", tmp_path)
    assert (private_path, public_path) == (tmp_path / "org-a", tmp_path / "org-a.pub")
    assert private_path.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public_path.read_text().startswith("ecdsa-sha2-nistp384 ") and public_path.read_text().endswith(" org-a\n")
    private = load_ssh_private_key(private_path.read_bytes(), None)
    public = load_ssh_public_key(public_path.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(private.curve, ec.SECP384R1)
    assert public.public_numbers() == private.public_key().public_numbers()
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600


def test_forced_new_key_replaces_an_existing_0644_file_instead_of_writing_into_it(tmp_path):
    private_path, public_path = deployment.make_org_key("org-a", tmp_path)
    os.chmod(private_path, 0o644)  # e.g. copied around carelessly
    os.link(private_path, tmp_path / "backup")  # another name for the same file
    old_key, old_inode = private_path.read_bytes(), private_path.stat().st_ino
    deployment.make_org_key("org-a", tmp_path, force=True)
    new = private_path.stat()
    assert stat.S_IMODE(new.st_mode) == 0o600 and new.st_ino != old_inode  # a new file, created 0600
    assert private_path.read_bytes() != old_key
    assert (tmp_path / "backup").read_bytes() == old_key  # the new key never went into the old 0644 inode
    assert stat.S_IMODE((tmp_path / "backup").stat().st_mode) == 0o644
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup", "org-a", "org-a.pub"]  # no temporary files


def test_private_files_are_created_0600_from_the_start(tmp_path, monkeypatch):
    opened = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        opened.append((Path(path), flags, mode))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(deployment.files.os, "open", spy)
    deployment.make_certs(tmp_path / "certs")
    deployment.make_org_key("org-a", tmp_path / "keys")
    modes = {path.name[1:].rsplit(".", 2)[0]: (mode, flags) for path, flags, mode in opened}  # .NAME.RANDOM.tmp
    assert sorted(modes) == ["ca.crt", "ca.key", "org-a", "org-a.pub", "server.key", "server.pem"]
    for name, (mode, flags) in modes.items():
        assert mode == (0o600 if name in ("ca.key", "server.key", "org-a") else 0o644), name
        assert flags & os.O_EXCL and flags & os.O_CREAT  # always a fresh file
    for path, _flags, _mode in opened:
        assert path.name.startswith(".") and not path.exists()  # renamed into place


def test_symlink_at_the_key_path_is_replaced_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "org-a").symlink_to(target)
    deployment.make_org_key("org-a", keys, force=True)
    assert target.read_text() == "keep me"
    assert not (keys / "org-a").is_symlink() and stat.S_IMODE((keys / "org-a").stat().st_mode) == 0o600


def test_a_new_output_directory_is_owner_only_and_an_existing_one_is_left_as_it_is(tmp_path):
    keys = tmp_path / "new" / "keys"
    deployment.make_org_key("org-a", keys)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    certs = tmp_path / "certs"
    deployment.make_certs(certs)
    assert stat.S_IMODE(certs.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    deployment.make_org_key("org-b", shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755


def test_org_key_loads_with_flowers_own_readers(tmp_path):
    import argparse

    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supernode.cli.flower_supernode import _try_setup_client_authentication

    private_path, public_path = deployment.make_org_key("org-b", tmp_path)
    assert try_load_public_key(public_path)  # what `flwr supernode register` does (NIST curve check included)
    keys = _try_setup_client_authentication(argparse.Namespace(auth_supernode_private_key=str(private_path),
                                                               auth_supernode_public_key=None))
    assert keys is not None and isinstance(keys[0], ec.EllipticCurvePrivateKey)


def test_org_key_refuses_overwrite_and_bad_names(tmp_path):
    deployment.make_org_key("org-a", tmp_path)
    with pytest.raises(deployment.DeployError, match="refusing to overwrite"):
        deployment.make_org_key("org-a", tmp_path)
    deployment.make_org_key("org-a", tmp_path, force=True)
    for bad in ("../evil", "a b", "", ".hidden"):
        with pytest.raises(deployment.DeployError, match="organization name"):
            deployment.make_org_key(bad, tmp_path)


# --- commands ----------------------------------------------------------------------------------------------------


@pytest.fixture()
def deploy_dir(tmp_path) -> Path:
    directory = tmp_path / "deploy"
    deployment.make_certs(directory)
    for org in ("org-a", "org-b"):
        deployment.make_org_key(org, directory)
    return directory


def _commands(deploy_dir: Path, **kwargs) -> str:
    orgs = [deployment.Org("org-a", str(SAMPLES / "org-a.jsonl"), str(deploy_dir.parent / "state-a")),
            deployment.Org("org-b", str(SAMPLES / "org-b.jsonl"), str(deploy_dir.parent / "state-b"),
                           model="embedded:tiny", task_mix="gcd:1")]
    return deployment.deployment_commands(deploy_dir, "127.0.0.1:8000", orgs, **kwargs)


def _argv(text: str, program: str) -> list[list[str]]:
    """Every command line of `program` in the printed text, split as the shell would (continuations joined)."""
    lines = text.replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        words = [w for w in words if "=" not in w or not w.split("=", 1)[0].isupper()]  # drop VAR=value prefixes
        if words and words[0] == program:
            out.append(words)
    return out


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_superlink_command_has_tls_auth_and_no_runtime_installation(deploy_dir):
    (superlink,) = _argv(_commands(deploy_dir), "flower-superlink")
    assert _option(superlink, "--ssl-ca-certfile") == str(deploy_dir / "ca.crt")
    assert _option(superlink, "--ssl-certfile") == str(deploy_dir / "server.pem")
    assert _option(superlink, "--ssl-keyfile") == str(deploy_dir / "server.key")
    assert "--enable-supernode-auth" in superlink and "--disable-runtime-dependency-installation" in superlink
    assert _option(superlink, "--port") == "8000" and _option(superlink, "--host") == "127.0.0.1"
    assert Path(_option(superlink, "--database")).is_absolute()


def test_supernode_commands_have_keys_distinct_ports_and_parseable_node_config(deploy_dir):
    from flwr.common.config import parse_config_args

    nodes = _argv(_commands(deploy_dir), "flower-supernode")
    assert len(nodes) == 2
    assert len({_option(n, "--port") for n in nodes}) == 2
    for org, argv in zip(("org-a", "org-b"), nodes):
        assert _option(argv, "--superlink") == "127.0.0.1:8000"
        assert _option(argv, "--root-certificates") == str(deploy_dir / "ca.crt")
        assert _option(argv, "--auth-supernode-private-key") == str(deploy_dir / org)
        config = parse_config_args([_option(argv, "--node-config")])  # exactly as flower-supernode parses it
        assert config["data-path"] == str(SAMPLES / f"{org}.jsonl")
        assert config["state-dir"] == str(deploy_dir.parent / f"state-{org[-1]}")
        assert Path(config["state-dir"]).is_absolute()
    config_b = parse_config_args([_option(nodes[1], "--node-config")])
    assert config_b["model-name"] == "embedded:tiny" and config_b["task-mix"] == "gcd:1"
    assert config_b["partition-id"] == 1


def test_supernodes_start_with_a_short_superexec_poll_interval_that_flower_reads(deploy_dir, monkeypatch):
    from flwr.supercore.superexec.run_superexec import _get_task_poll_interval

    lines = _commands(deploy_dir).replace("\\\n", " ").splitlines()
    nodes = [shlex.split(line) for line in lines if "flower-supernode" in line and not line.startswith("#")]
    assert len(nodes) == 2
    for words in nodes:
        env = dict(w.split("=", 1) for w in words[:words.index("flower-supernode")])
        assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == deployment.SUPERNODE_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    # the name and value are Flower 1.42's: flower-superexec (which inherits the SuperNode's environment) reads them
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL",
                       deployment.SUPERNODE_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"])
    assert _get_task_poll_interval() == 0.2
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL")
    assert _get_task_poll_interval() == 1.0  # Flower's default


def test_registration_connection_and_run_commands(deploy_dir):
    text = _commands(deploy_dir, connection="prod", run_config=["num-server-rounds=2 strategy.mode='pubswap'"])
    registers = _argv(text, "flwr")
    assert ["flwr", "supernode", "register", str(deploy_dir / "org-a.pub"), "prod", "--name", "org-a"] in registers
    assert ["flwr", "supernode", "register", str(deploy_dir / "org-b.pub"), "prod", "--name", "org-b"] in registers
    assert "[superlink.prod]" in text and 'address = "127.0.0.1:8000"' in text
    assert f'root-certificates = "{deploy_dir / "ca.crt"}"' in text
    (run,) = [a for a in registers if a[:2] == ["flwr", "run"]]
    assert run[2:5] == [".", "prod", "--stream"]
    assert "num-server-rounds=2 strategy.mode='pubswap'" in run
    assert f"output.dir='{deploy_dir / 'runs'}'" in run
    assert f"cd {PROJECT}" in text
    assert any(a[:3] == ["flwr", "ls", "prod"] for a in registers)


def test_relative_paths_are_printed_absolute(deploy_dir, monkeypatch):
    deployment.make_certs(deploy_dir, ["10.0.0.5"], force=True)
    monkeypatch.chdir(deploy_dir.parent)
    orgs = [deployment.Org("org-a", os.path.relpath(SAMPLES / "org-a.jsonl"), "state-a")]
    text = deployment.deployment_commands("deploy", "10.0.0.5:9000", orgs)
    (node,) = _argv(text, "flower-supernode")
    assert _option(node, "--auth-supernode-private-key") == str(deploy_dir / "org-a")
    assert f'state-dir="{deploy_dir.parent / "state-a"}"' in _option(node, "--node-config")
    (superlink,) = _argv(text, "flower-superlink")
    assert _option(superlink, "--host") == "0.0.0.0"  # remote SuperNodes must reach it


@pytest.mark.parametrize("orgs, kwargs, message", [
    ([], {}, "at least one --org"),
    ([deployment.Org("org-a", "x.jsonl", "s")], {}, "does not exist"),
    ([deployment.Org("org-a", None, None)], {}, "no --state-dir"),
    ([deployment.Org("org-a", None, "s1", port=9100), deployment.Org("org-b", None, "s2", port=9100)], {},
     "port values repeat"),
    ([deployment.Org("org-a", None, "s"), deployment.Org("org-b", None, "s")], {}, "share a --state-dir"),
    ([deployment.Org("org-a", None, "s")], {"run_config": ["configs/smoke.toml"]}, "TOML file"),
    ([deployment.Org("org-a", None, 's"q')], {}, "double quote"),
    ([deployment.Org("org-c", None, "s")], {}, "missing in"),
    ([deployment.Org("superlink", None, "s")], {}, "reserved"),
])
def test_commands_errors(deploy_dir, orgs, kwargs, message):
    with pytest.raises(deployment.DeployError, match=message):
        deployment.deployment_commands(deploy_dir, "127.0.0.1:8000", orgs, **kwargs)


@pytest.mark.parametrize("address", ["https://host:8000", "host", "host:0", "host:port"])
def test_superlink_address_must_be_host_port(deploy_dir, address):
    with pytest.raises(deployment.DeployError, match="--superlink|out of range"):
        deployment.deployment_commands(deploy_dir, address, [deployment.Org("org-a", None, "s")])


def test_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["deploy", "certs", "--out", str(out), "--host", "10.9.8.7"]) == 0
    assert "10.9.8.7" in capsys.readouterr().out
    assert main(["deploy", "key", "--org", "org-a", "--out", str(out)]) == 0
    assert main(["deploy", "key", "--org", "org-a", "--out", str(out)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["deploy", "commands", "--dir", str(out), "--superlink", "10.9.8.7:8000",
                 "--org", "org-a", "--data", str(SAMPLES / "org-a.jsonl"), "--state-dir", str(tmp_path / "s"),
                 "--port", "9200", "-c", "num-server-rounds=1"]) == 0
    text = capsys.readouterr().out
    (node,) = _argv(text, "flower-supernode")
    assert _option(node, "--port") == "9200"
    assert main(["deploy", "commands", "--dir", str(out), "--superlink", "10.9.8.7:8000",
                 "--org", "org-b", "--state-dir", str(tmp_path / "s")]) == 2
    assert "org-b.pub" in capsys.readouterr().err


def test_cli_per_org_options_must_follow_an_org(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy", "commands", "--dir", str(tmp_path), "--superlink", "h:1", "--data", "x"])
    assert exit_info.value.code == 2
    assert "--data must follow an --org" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["localhost:8000", "LOCALHOST:8000", "127.0.0.1:8000", "[::1]:8000",
                                     "superlink.example.org:9000", "10.1.2.3:8000", "node7.fleet.example.org:8000"])
def test_commands_accept_every_address_in_the_certificate(tmp_path, address):
    directory = tmp_path / "d"
    deployment.make_certs(directory, ["superlink.example.org", "10.1.2.3", "::1", "*.fleet.example.org"])
    deployment.make_org_key("org-a", directory)
    text = deployment.deployment_commands(directory, address, [deployment.Org("org-a", None, str(tmp_path / "s"))])
    (node,) = _argv(text, "flower-supernode")
    assert _option(node, "--superlink") == address  # an IPv6 address keeps its brackets
    if address.startswith("[::1]"):
        (superlink,) = _argv(text, "flower-superlink")
        assert _option(superlink, "--host") == "::1"  # listens where the SuperNodes dial


@pytest.mark.parametrize("address, host", [("10.9.8.7:8000", "10.9.8.7"), ("superlink.example.org:8000",
                                                                          "superlink.example.org"),
                                           ("a.b.fleet.example.org:8000", "a.b.fleet.example.org"),
                                           ("[::2]:8000", "::2")])
def test_commands_refuse_an_address_outside_the_certificate(tmp_path, capsys, address, host):
    directory = tmp_path / "d"
    deployment.make_certs(directory, ["*.fleet.example.org"])
    deployment.make_org_key("org-a", directory)
    code = main(["deploy", "commands", "--dir", str(directory), "--superlink", address,
                 "--org", "org-a", "--state-dir", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: --superlink host {host!r} is not in server.pem's subjectAltName "
                                   "(localhost, *.fleet.example.org, 127.0.0.1): TLS clients would refuse")
    assert f"--host {host} --force" in captured.err


def test_commands_without_file_checks_do_not_read_the_certificate(tmp_path):
    text = deployment.deployment_commands(tmp_path / "nothing-here", "10.9.8.7:8000",
                                      [deployment.Org("org-a", None, str(tmp_path / "s"))], check_files=False)
    assert "--superlink 10.9.8.7:8000" in text
