"""Where the deployment helpers write: an owner-only output directory, no silent overwrites, atomic writes with
the final mode from the start (private keys never readable by others)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Sequence


class DeployError(RuntimeError):
    """A deployment helper could not do what was asked (bad argument, unwritable directory, existing file...)."""


def output_dir(out: str | Path) -> Path:
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


def refuse_existing(paths: Sequence[Path], force: bool) -> None:
    """Refuse to replace existing files (or symlinks) unless `force` is given."""
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing and not force:
        raise DeployError(f"refusing to overwrite existing file(s): {', '.join(existing)} (use --force to replace "
                          "them; anything signed by or registered with the old ones stops working)")


def write_file(path: Path, data: bytes, private: bool) -> None:
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
