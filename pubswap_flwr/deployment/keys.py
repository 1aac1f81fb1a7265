"""SuperNode authentication keys: one EC P-384 key pair per organization, in the OpenSSH format Flower reads."""

from __future__ import annotations

import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .certificates import CURVE
from .files import DeployError, output_dir, refuse_existing, write_file

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_org_name(org: str) -> str:
    """`org` when it can be a file name (the key pair's); DeployError otherwise."""
    if not NAME_PATTERN.match(org or ""):
        raise DeployError(f"organization name {org!r} must be 1-64 letters, digits, '.', '_' or '-' and start with "
                          "a letter or digit (it becomes a file name)")
    return org


def make_org_key(org: str, out: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """An EC P-384 key pair in OpenSSH format: `out/org` (private, 0600) and `out/org.pub` ("ecdsa-sha2-nistp384
    ... org"), as `flower-supernode --auth-supernode-private-key` and `flwr supernode register` read them."""
    check_org_name(org)
    directory = output_dir(out)
    private_path, public_path = directory / org, directory / f"{org}.pub"
    refuse_existing([private_path, public_path], force)
    key = ec.generate_private_key(CURVE())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_file(private_path, private, private=True)
    write_file(public_path, public + b" " + org.encode() + b"\n", private=False)
    return private_path, public_path
