"""TLS for the SuperLink: a CA and a server certificate signed by it, and the check that the address SuperNodes
dial is one the certificate names."""

from __future__ import annotations

import datetime
import ipaddress
import re
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .files import DeployError, output_dir, refuse_existing, write_file

CERT_FILES = ("ca.crt", "ca.key", "server.pem", "server.key")
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
CURVE = ec.SECP384R1  # NIST P-384: Flower accepts NIST curves only for SuperNode auth keys
DNS_PATTERN = re.compile(r"^(?=.{1,253}$)(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                         r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


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
                          f"({', '.join(names) or 'none'}): TLS clients would refuse the connection; use one of "
                          f"those names, or reissue the certificates with `pubswap deploy certs --out "
                          f"{cert_path.parent} --host {host} --force` and hand out the new ca.crt")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pubswap-flwr"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """A CA signs certificates and CRLs; the server signs and agrees keys (TLS with EC keys)."""
    return x509.KeyUsage(digital_signature=not signs_certificates, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=not signs_certificates,
                         key_cert_sign=signs_certificates, crl_sign=signs_certificates, encipher_only=False,
                         decipher_only=False)


def _ca_certificate(ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, now: datetime.datetime,
                    until: datetime.datetime) -> x509.Certificate:
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )


def _server_certificate(server_key: ec.EllipticCurvePrivateKey, first_host: str, sans: list[x509.GeneralName],
                        ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, now: datetime.datetime,
                        until: datetime.datetime) -> x509.Certificate:
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(_name(f"pubswap-flwr SuperLink {first_host}")).issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )


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
    ca_cert = _ca_certificate(ca_key, ca_name, now, until)
    server_key = ec.generate_private_key(CURVE())
    first = hosts[0].strip().strip("[]") if hosts else "localhost"
    server_cert = _server_certificate(server_key, first, sans, ca_key, ca_name, now, until)

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(encoding=serialization.Encoding.PEM, format=serialization.PrivateFormat.PKCS8,
                                 encryption_algorithm=serialization.NoEncryption())

    return {
        "ca.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "ca.key": pem_key(ca_key),
        "server.pem": server_cert.public_bytes(serialization.Encoding.PEM),
        "server.key": pem_key(server_key),
    }


def make_certs(out: str | Path, hosts: Sequence[str] = (), *, days: int = 365, force: bool = False) -> dict[str, Path]:
    """Write ca.crt, ca.key, server.pem, server.key into `out` (keys mode 0600); returns name -> path."""
    files = build_certificates(hosts, days)  # validates the hosts before anything is created
    directory = output_dir(out)
    paths = {name: directory / name for name in CERT_FILES}
    refuse_existing(list(paths.values()), force)
    for name, data in files.items():
        write_file(paths[name], data, private=name.endswith(".key"))
    return paths
