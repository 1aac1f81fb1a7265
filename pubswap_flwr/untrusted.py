"""Files and folders someone else made: regular files read without following links or blocking, owned folders."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 1 << 30  # a run's metrics.jsonl is a few MB, a SmolLM2 adapter 10 MB; beyond this is not a run's


class UntrustedFileError(ValueError):
    """A file or folder that cannot be used as it is; the message names it and says why, on one line."""


class NotOwnedError(UntrustedFileError):
    """A folder another user could change: `kind` is "link" (a link or not a folder), "owner" or "mode"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def check_owned_dir(path: Path, forbidden_mode: int = 0o022) -> None:
    """Refuse a folder that is a link or not a folder, belongs to another user, or has any of `forbidden_mode`'s
    bits (default: writable by group or others). OSError when it does not exist."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotOwnedError("link", f"{path} must be a plain directory, not a link or a file")
    if info.st_uid != os.getuid():
        raise NotOwnedError("owner", f"{path} belongs to uid {info.st_uid}, not to this user ({os.getuid()})")
    if info.st_mode & forbidden_mode:
        raise NotOwnedError("mode", f"{path} has mode {stat.S_IMODE(info.st_mode):o}")


def check_no_links(path: Path, root: Path) -> None:
    """Refuse `path` when it or a folder between `root` and it is a link (`root` itself is the caller's choice)."""
    path, root = Path(path), Path(root)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise UntrustedFileError(f"{path}: not inside {root}") from None
    current = root
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # what is missing is the reader's to report
        except OSError as err:
            raise UntrustedFileError(f"{current}: cannot be read ({err.strerror})") from None
        if stat.S_ISLNK(mode):
            raise UntrustedFileError(f"{current}: a link; a run's files and folders are read only as they are, "
                                     "links are refused")


def is_present(path: Path) -> bool:
    """Whether anything (a file, link, FIFO, ...) is at `path`, without following a link."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def read_bytes(path: Path, root: Path | None = None, limit: int = MAX_FILE_BYTES) -> bytes:
    """The content of the regular file `path`: a link, FIFO, device or folder is refused from its status before it
    is opened (a FIFO would block), and the file is opened without following links or blocking. With `root`, a
    folder between `root` and it that is a link is refused too."""
    path = Path(path)
    if root is not None:
        check_no_links(path.parent, root)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UntrustedFileError(f"{path}: missing") from None
    except OSError as err:
        raise UntrustedFileError(f"{path}: cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFileError(f"{path}: not a regular file (links, FIFOs, devices and folders are refused)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:  # replaced by a link since the check
            raise UntrustedFileError(f"{path}: not a regular file (links, FIFOs, devices and folders are "
                                     "refused)") from None
        raise UntrustedFileError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{path}: not a regular file (links, FIFOs, devices and folders are refused)")
        if info.st_size > limit:
            raise UntrustedFileError(f"{path}: {info.st_size} bytes, over the {limit} this reads")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UntrustedFileError(f"{path}: over the {limit} bytes this reads")
        return b"".join(chunks)
    except OSError as err:
        raise UntrustedFileError(f"{path}: cannot be read ({err.strerror})") from None
    finally:
        os.close(fd)


def read_text(path: Path, root: Path | None = None, limit: int = MAX_FILE_BYTES) -> str:
    """`read_bytes` as UTF-8 text."""
    try:
        return read_bytes(path, root, limit).decode("utf-8")
    except UnicodeDecodeError as err:
        raise UntrustedFileError(f"{path}: not UTF-8 text (byte {err.start})") from None


def parse_json(text: str, where: str) -> Any:
    """JSON from `text`; UntrustedFileError naming `where` for anything json cannot take."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UntrustedFileError(f"{where}: not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # an integer of over 4300 digits; nesting deeper than the stack
        raise UntrustedFileError(f"{where}: not usable JSON ({type(err).__name__})") from None


def read_json(path: Path, root: Path | None = None, limit: int = MAX_FILE_BYTES) -> Any:
    """`read_text` parsed as JSON."""
    return parse_json(read_text(path, root, limit), str(path))


def write_replacing(path: Path, data: bytes) -> None:
    """`data` as the file `path`, written beside it and renamed over it: a link planted at `path` is replaced, never
    written through, and a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600; what a plainly written file gets
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def one_line(text: object) -> str:
    """`text` on one line (a path or value from a file may hold line breaks)."""
    return str(text).replace("\r", "\\r").replace("\n", "\\n")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on or not show (control characters, escapes, line and
    format characters such as a right-to-left override) written as its Python escape, e.g. "\\x1b[2J"."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
