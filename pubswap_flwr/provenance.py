"""Which code and environment made a run: package version, git commit and uncommitted changes, where the code was
loaded from, the versions that decide the numbers, and the machine. The ServerApp writes it into every run folder
(provenance.json, one entry per start: a resumed run records each) and `pubswap report` shows it and warns when the
runs of one report were made by different code."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from .schema import SchemaError, parse

log = logging.getLogger(__name__)
PROVENANCE_FILE = "provenance.json"
PACKAGES = ("torch", "flwr", "transformers", "peft", "reasoning-gym", "numpy")
# what can change a run's numbers: a checkout with changes here is "dirty"; runs/, results/, docs/ do not count
CODE_PATHS = ("pubswap_flwr", "client_app.py", "server_app.py", "pyproject.toml", "configs", "data/models")
# instruction sets that change which matmul kernels torch picks on a CPU, and so a run's last digits: the same seed's
# round-0 greedy evaluation differed by one item of 64 between an AMD EPYC and an Intel Xeon with AMX (bf16 sampling)
CPU_NUMERIC_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git(root: Path, *args: str) -> str | None:
    """git's output (not stripped: porcelain lines start with a space), or None when git fails or is missing."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(root: Path) -> dict[str, Any]:
    """{"commit", "dirty", "changed"} of the checkout at `root`, or {"checkout": "not a git checkout"}."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return {"checkout": "not a git checkout"}
    commit = (_git(root, "rev-parse", "HEAD") or "unknown").strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS) or ""
    changed = sorted(line[3:] for line in status.splitlines() if line.strip())
    return {"commit": commit, "dirty": bool(changed), "changed": changed[:50]}


def _device() -> dict[str, Any]:
    out: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                           "cpus": os.cpu_count() or 0}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("model name") and "cpu" not in out:
            out["cpu"] = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and "cpu_flags" not in out:
            present = set(line.split(":", 1)[1].split())
            out["cpu_flags"] = [flag for flag in CPU_NUMERIC_FLAGS if flag in present]
    if "torch" in sys.modules:  # the ServerApp has it loaded already; never import it just for this
        torch = sys.modules["torch"]
        out["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            out["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


def collect() -> dict[str, Any]:
    """This process's provenance (what `write` records)."""
    package_dir = Path(__file__).resolve().parent
    root = package_dir.parent
    from .policy.data import _editable_source_dir

    install = _editable_source_dir()
    code = git_state(root)
    if "commit" not in code and install is not None and install.resolve() != root.resolve():
        code = {**git_state(install), "note": f"code loaded from {root}, not a checkout; installed from {install}"}
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "package": "pubswap-flwr",
            "version": _version("pubswap-flwr"), "code_dir": str(root),
            "installed_from": str(install) if install else None, "code": code,
            "python": sys.version.split()[0], "executable": sys.executable,
            "packages": {name: _version(name) for name in PACKAGES}, "device": _device()}


def write(run_dir: Path, *, resumed: bool = False) -> dict[str, Any]:
    """Append this start's provenance to run_dir/provenance.json (a new run starts the list afresh)."""
    entry = {**collect(), "start": "resume" if resumed else "new"}
    path = Path(run_dir) / PROVENANCE_FILE
    starts = [s for s in _recorded(run_dir) if isinstance(s, dict)] if resumed else []  # kept as written
    starts.append(entry)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"starts": starts}, indent=1) + "\n")
    tmp.replace(path)
    return entry


class CodeRecord(Struct, frozen=True):
    """A start's `code`: the commit and whether the code paths had changes, or why there is no commit."""

    commit: str | None = None
    dirty: bool = False
    changed: list[str] = field(default_factory=list)
    checkout: str = "unknown"


class DeviceRecord(Struct, frozen=True):
    """The part of a start's `device` that labels it, and its CPU count (platform and threads are recorded but not
    read back)."""

    cpu: str = ""
    cpus: Annotated[int, Meta(ge=0, le=1_000_000)] = 0  # os.cpu_count(); 0: not recorded
    cpu_flags: list[str] | None = None  # None: recorded before the flags were


class ProvenanceStart(Struct, frozen=True):
    """One start of a run as the report and the logs read it; every field may be absent (older records)."""

    version: str = "?"
    code_dir: str = ""
    start: str = "new"
    code: CodeRecord = field(default_factory=CodeRecord)
    packages: dict[str, str] = field(default_factory=dict)
    device: DeviceRecord = field(default_factory=DeviceRecord)


def start_of(value: Any, what: str = "provenance start") -> ProvenanceStart:
    """A recorded start checked against its declaration; SchemaError naming the field."""
    return parse(value, ProvenanceStart, what)


def _recorded(run_dir: Path) -> list[Any]:
    """The starts list of run_dir/provenance.json as written ([] when there is none or it cannot be read: the file is
    another party's, so unreadable content counts as no record, with a warning)."""
    from .untrusted import UntrustedFileError, is_present, parse_json, read_bytes

    path = Path(run_dir) / PROVENANCE_FILE
    if not is_present(path):
        return []
    raw = read_bytes(path)  # a link or FIFO is refused (UntrustedFileError), never followed or opened
    try:
        data = parse_json(raw.decode("utf-8"), str(path))
    except (UnicodeDecodeError, UntrustedFileError):
        log.warning("%s is not JSON text: read as no provenance record", path)
        return []
    starts = data.get("starts") if isinstance(data, dict) else None
    if not isinstance(starts, list):
        log.warning("%s holds no list of starts: read as no provenance record", path)
        return []
    return starts


def read(run_dir: Path) -> list[ProvenanceStart]:
    """The recorded starts of a run ([] for a run made before provenance was recorded); a start that breaks its
    declaration is left out with a warning naming the field."""
    usable = []
    for index, start in enumerate(_recorded(run_dir)):
        try:
            usable.append(start_of(start, f"starts[{index}]"))
        except SchemaError as err:
            log.warning("%s: %s; that start is left out", Path(run_dir) / PROVENANCE_FILE, err)
    return usable


def code_label(entry: ProvenanceStart) -> str:
    """`abc1234`, `abc1234+changes`, or `not a git checkout` (plus the package version)."""
    code = entry.code
    label = code.commit[:7] + ("+changes" if code.dirty else "") if code.commit is not None else code.checkout
    return f"{label} (pubswap-flwr {entry.version})"


def environment_label(entry: ProvenanceStart) -> str:
    return ", ".join(f"{name} {entry.packages.get(name, '?')}" for name in ("torch", "flwr", "transformers", "peft"))


def cpu_label(entry: ProvenanceStart) -> str:
    """`AMD EPYC`, or with the numerics-relevant flags when recorded: `Intel(R) Xeon(R) Processor (avx2, amx_bf16)`;
    `unknown CPU` for a start that recorded none."""
    device = entry.device
    label = device.cpu or "unknown CPU"
    if device.cpu_flags is not None:
        label += f" ({', '.join(device.cpu_flags) or 'no avx2'})"
    return label
