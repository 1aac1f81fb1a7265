"""The lint gate (issue #38 item 4): `.ci/run` lints with ruff after setup and before the test command, a lint error
fails CI with its own message, and the project's ruff rules catch unsorted and unused imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI_RUN = ROOT / ".ci" / "run"
TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest"

# stands in for .venv/bin/python in a copy of .ci/run: logs each call, and exits as the test asks
FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
case "$2" in
    ruff) exit "${RUFF_RC:-0}" ;;
    pytest) exit "${PYTEST_RC:-0}" ;;
esac
"""


def test_ci_runs_ruff_after_setup_and_before_the_readme_test_command():
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    setup = next(i for i, line in enumerate(commands) if line.startswith("bash scripts/setup.sh"))
    lint = next(i for i, line in enumerate(commands) if ".venv/bin/python -m ruff check ." in line)
    test = next(i for i, line in enumerate(commands) if line.startswith(TEST_COMMAND))
    assert setup < lint < test
    assert "ruff==0.17.6" in (ROOT / "pyproject.toml").read_text()  # setup.sh installs the test extras


def _run_ci(tmp_path: Path, ruff_rc: int, pytest_rc: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / ".ci").mkdir()
    shutil.copy(CI_RUN, tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text('echo setup >> "$CALLS"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {**os.environ, "CALLS": str(calls), "RUFF_RC": str(ruff_rc), "PYTEST_RC": str(pytest_rc)}
    result = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, calls.read_text().splitlines()


@pytest.mark.parametrize(("ruff_rc", "pytest_rc", "expected_rc"), [(0, 0, 0), (0, 1, 1), (0, 5, 1)])
def test_ci_lints_then_tests(tmp_path, ruff_rc, pytest_rc, expected_rc):
    result, calls = _run_ci(tmp_path, ruff_rc, pytest_rc)
    assert result.returncode == expected_rc
    assert calls[0] == "setup" and calls[1] == "python -m ruff check ."
    assert calls[-1] == "python -m pytest"
    assert ("collected no tests" in result.stderr) == (pytest_rc == 5)


def test_a_lint_error_fails_ci_before_the_tests(tmp_path):
    result, calls = _run_ci(tmp_path, ruff_rc=1, pytest_rc=0)
    assert result.returncode == 1
    assert "CI failure: ruff check . found lint errors" in result.stderr
    assert "python -m pytest" not in calls


def _ruff(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "sample.py").write_text(source)
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
               "--output-format", "concise", "sample.py"]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_project_rules_pass_clean_code(tmp_path):
    result = _ruff(tmp_path, "import os\nimport sys\n\nprint(os.sep, sys.argv)\n")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("source", "rule"), [
    ("import sys\nimport os\n\nprint(os.sep, sys.argv)\n", "I001"),  # unsorted imports
    ("import os\n\nprint('no os here')\n", "F401"),  # unused import
    ("x = 1\n\n\ndef f():\n    return '" + "y" * 120 + "'\n", "E501"),  # over 120 characters
])
def test_the_project_rules_fail_lint_errors(tmp_path, source, rule):
    result = _ruff(tmp_path, source)
    assert result.returncode == 1
    assert rule in result.stdout
