"""The lint gate (issue #38 item 4): `.ci/run` lints with ruff after setup, then checks the import contracts
(lint-imports) and the types (mypy), all before the test command; a lint error, a broken contract or a type error
fails CI with its own message, the project's ruff rules catch unsorted and unused imports, its import contracts hold
today and catch a light module importing torch, and its mypy settings catch a type error and a bare or unused
`type: ignore`."""

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
# the calls the copy of .ci/run below makes before the test command, in order
GATE = ["setup", "python -m ruff check .", "lint-imports --no-cache", "python -m mypy --cache-dir=/dev/null"]

# stands in for .venv/bin/python in a copy of .ci/run: logs each call, and exits as the test asks
FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$CALLS"
case "$2" in
    ruff) exit "${RUFF_RC:-0}" ;;
    mypy) exit "${MYPY_RC:-0}" ;;
    pytest) exit "${PYTEST_RC:-0}" ;;
esac
"""
# stands in for .venv/bin/lint-imports
FAKE_LINT_IMPORTS = """#!/usr/bin/env bash
echo "lint-imports $*" >> "$CALLS"
exit "${IMPORTS_RC:-0}"
"""


def test_ci_runs_the_lint_gate_after_setup_and_before_the_readme_test_command():
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    setup = next(i for i, line in enumerate(commands) if line.startswith("bash scripts/setup.sh"))
    lint = next(i for i, line in enumerate(commands) if ".venv/bin/python -m ruff check ." in line)
    contracts = next(i for i, line in enumerate(commands) if ".venv/bin/lint-imports --no-cache" in line)
    types = next(i for i, line in enumerate(commands) if ".venv/bin/python -m mypy --cache-dir=/dev/null" in line)
    test = next(i for i, line in enumerate(commands) if line.startswith(TEST_COMMAND))
    assert setup < lint < contracts < types < test
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert all(pin in pyproject for pin in ("ruff==0.17.6", "import-linter==2.17", "mypy==2.4.1"))  # the test extras


def _run_ci(tmp_path: Path, ruff_rc: int, pytest_rc: int, imports_rc: int = 0,
            mypy_rc: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    (tmp_path / ".ci").mkdir()
    shutil.copy(CI_RUN, tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup.sh").write_text('echo setup >> "$CALLS"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    lint_imports = python.parent / "lint-imports"
    lint_imports.write_text(FAKE_LINT_IMPORTS)
    lint_imports.chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {**os.environ, "CALLS": str(calls), "RUFF_RC": str(ruff_rc), "PYTEST_RC": str(pytest_rc),
           "IMPORTS_RC": str(imports_rc), "MYPY_RC": str(mypy_rc)}
    result = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, calls.read_text().splitlines()


@pytest.mark.parametrize(("ruff_rc", "pytest_rc", "expected_rc"), [(0, 0, 0), (0, 1, 1), (0, 5, 1)])
def test_ci_lints_then_tests(tmp_path, ruff_rc, pytest_rc, expected_rc):
    result, calls = _run_ci(tmp_path, ruff_rc, pytest_rc)
    assert result.returncode == expected_rc
    assert calls[:4] == GATE
    assert calls[-1] == "python -m pytest"
    assert ("collected no tests" in result.stderr) == (pytest_rc == 5)


def test_a_lint_error_fails_ci_before_the_tests(tmp_path):
    result, calls = _run_ci(tmp_path, ruff_rc=1, pytest_rc=0)
    assert result.returncode == 1
    assert "CI failure: ruff check . found lint errors" in result.stderr
    assert "python -m pytest" not in calls


def test_a_broken_import_contract_fails_ci_before_the_tests(tmp_path):
    result, calls = _run_ci(tmp_path, ruff_rc=0, pytest_rc=0, imports_rc=1)
    assert result.returncode == 1
    assert "CI failure: lint-imports found a broken import contract" in result.stderr
    assert calls == GATE[:3]


def test_a_type_error_fails_ci_before_the_tests(tmp_path):
    result, calls = _run_ci(tmp_path, ruff_rc=0, pytest_rc=0, mypy_rc=1)
    assert result.returncode == 1
    assert "CI failure: mypy found type errors" in result.stderr
    assert calls == GATE


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts on the package copy under `root`."""
    lint_imports = Path(sys.executable).parent / "lint-imports"  # the test extras' console script
    command = [str(lint_imports), "--no-cache", "--config", str(ROOT / "pyproject.toml")]
    return subprocess.run(command, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                          text=True, timeout=120)


def test_the_import_contracts_hold_today_and_catch_torch_in_a_light_module(tmp_path):
    shutil.copytree(ROOT / "pubswap_flwr", tmp_path / "pubswap_flwr", ignore=shutil.ignore_patterns("__pycache__"))
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0 and "0 broken" in kept.stdout, kept.stdout + kept.stderr
    config_keys = tmp_path / "pubswap_flwr" / "config/keys.py"
    config_keys.write_text(config_keys.read_text() + "\n\ndef _heavy():\n    import torch\n\n    return torch\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode == 1
    assert "pubswap_flwr.config.keys -> torch" in broken.stdout and "1 broken" in broken.stdout, broken.stdout


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


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "sample.py").write_text(source)
    command = [sys.executable, "-m", "mypy", "--cache-dir=/dev/null", "--config-file", str(ROOT / "pyproject.toml"),
               "sample.py"]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("source", "code"), [
    ("def f() -> int:\n    return 'text'\n", "return-value"),  # a type error
    ("x: int = 'text'  # type: ignore\n", "ignore-without-code"),  # an ignore that names no error code
    ("x: int = 1  # type: ignore[assignment]\n", "unused-ignore"),  # an ignore no longer needed
])
def test_the_project_mypy_settings_fail_type_errors(tmp_path, source, code):
    result = _mypy(tmp_path, source)
    assert result.returncode == 1
    assert f"[{code}]" in result.stdout, result.stdout + result.stderr


def _import_cycles(package: str) -> set[tuple[str, str]]:
    """Pairs of modules of `package` that import each other, directly or through others, at run time (imports
    inside functions count, `if TYPE_CHECKING:` ones do not, as in the import contracts)."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False, exclude_type_checking_imports=True)
    return {tuple(sorted((a, b))) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
            if graph.chain_exists(importer=b, imported=a)}


def test_no_two_modules_of_the_package_import_each_other():
    # issue #38: 0 circles (the last, policy.model <-> policy.packaged, went with policy/data.py)
    assert _import_cycles("pubswap_flwr") == set()


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path, monkeypatch):
    package = tmp_path / "cyclic_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("from .a import b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _import_cycles("cyclic_pkg") == {("cyclic_pkg.a", "cyclic_pkg.b"), ("cyclic_pkg.b", "cyclic_pkg.c"),
                                            ("cyclic_pkg.a", "cyclic_pkg.c")}


def _unlevelled(modules: set[str], layers: list[str]) -> list[str]:
    """The modules no level of a layers contract covers (a level names folders and modules joined by ':' or '|'; a
    folder covers every module inside it). The package's own __init__ is in no level."""
    names = [name.strip() for layer in layers for name in layer.replace("|", ":").split(":")]
    root = names[0].split(".")[0] if names else ""
    return sorted(m for m in modules if m != root and not any(m == n or m.startswith(n + ".") for n in names))


def test_every_module_of_the_package_has_a_level_in_contract_c():
    import tomllib

    import grimp

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    levels = next(c for c in contracts if c["name"].startswith("the package in levels by folder"))["layers"]
    modules = set(grimp.build_graph("pubswap_flwr", include_external_packages=False).modules)
    assert len(modules) > 100 and _unlevelled(modules, levels) == []
    # a new single module outside every folder of the order is caught; one inside a folder takes its folder's level
    assert _unlevelled(modules | {"pubswap_flwr.newcomer", "pubswap_flwr.wire.newcomer"}, levels) == [
        "pubswap_flwr.newcomer"]


def _imports_of(package: str, sources: str, targets: tuple[str, ...]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module under `sources` imports one under `targets`, counting imports under
    `if TYPE_CHECKING:` (which the contracts leave out)."""
    import grimp

    graph = grimp.build_graph(package, include_external_packages=False, exclude_type_checking_imports=False)
    inside = lambda module, roots: any(module == r or module.startswith(r + ".") for r in roots)  # noqa: E731
    return sorted((a, b) for a in graph.modules if inside(a, (sources,))
                  for b in graph.find_modules_directly_imported_by(a) if inside(b, targets))


def test_the_wire_imports_neither_party_not_even_for_types():
    parties = tuple(f"pubswap_flwr.{f}" for f in ("server", "rounds", "node", "node_runtime", "protocols"))
    assert _imports_of("pubswap_flwr", "pubswap_flwr.wire", parties) == []
    # the check sees a type-only import (a round's context names the exchange for its type)
    assert _imports_of("pubswap_flwr", "pubswap_flwr.rounds.context", ("pubswap_flwr.rounds.exchange",)) == [
        ("pubswap_flwr.rounds.context", "pubswap_flwr.rounds.exchange")]


def _long_signatures(source: str) -> list[str]:
    """Functions with more than 7 parameters (self and cls aside) without a `# parameters: <why>` line just above
    their first decorator or their `def`."""
    import ast

    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            above = lines[first - 2].strip() if first >= 2 else ""
            if len(names) > 7 and not (above.startswith("# parameters: ") and len(above) > len("# parameters: ")):
                found.append(f"{node.name} ({len(names)} parameters)")
    return found


def test_a_function_over_7_parameters_says_why():
    found = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / "pubswap_flwr").rglob("*.py"))
             if (hits := _long_signatures(path.read_text()))}
    assert found == {}, f"functions over 7 parameters without a '# parameters: <why>' line above them: {found}"
    eight = "def f(a, b, c, d, e, f, g, h):\n    pass\n"
    assert _long_signatures(eight) == ["f (8 parameters)"]
    assert _long_signatures("# parameters: the command's options\n" + eight) == []
    assert _long_signatures("def f(self, a, b, c, d, e, f, g):\n    pass\n") == []
