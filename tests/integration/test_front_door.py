"""The README's path as a new user takes it: from a copy of the checkout, with none of Flower's variables set (so
`pubswap run` uses a SuperLink of the checkout's own, its home under the data directory), `pubswap run` twice in a
row (starting the SuperLink, then finding it running), then `pubswap report` and `pubswap verify` on a run; the
checkout gains no file (a Flower home inside it once made each app bundle carry the previous ones, until the fourth
was refused), and `pubswap superlink stop` ends the SuperLink."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pubswap_flwr import superlink

from .flower_harness import _processes, descendants, stop_pids

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]
FAB_INCLUDE = ("*.py", "*.toml", "*.md", "*.json", "*.jsonl")  # pyproject's fab-include: what `flwr run .` needs
TINY = ("num-server-rounds=1 train.local-steps=1 train.prompts-per-step=2 train.completions-per-prompt=2 "
        "eval.items-per-task=4 eval.samples=1 model.threads=1")
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]


def copy_checkout(dest: Path) -> Path:
    """The checkout's tracked and unignored text files (no weights or published runs: the copy's code finds the
    models through the installed checkout, as a FAB's does), committed in a git repository of their own."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    kept = (".gitignore", "docs/results/README.md")  # Flower refuses a fab-exclude pattern that matches nothing
    for name in listed:
        if name in kept or (any(fnmatch.fnmatch(Path(name).name, p) for p in FAB_INCLUDE)
                            and not name.startswith("docs/results/") and (PROJECT / name).is_file()):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / name, dest / name)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run(GIT + args, cwd=dest, check=True, capture_output=True)
    return dest


def listing(root: Path) -> set[str]:
    """Every file and folder under `root`, but its .git."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.relative_to(root).parts}


def git_status(root: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True, text=True,
                          check=True).stdout


def stop_superlink(http_port: int) -> None:
    table = _processes()
    roots = [pid for pid, (_, cmd) in table.items() if "flower-superlink" in cmd and str(http_port) in cmd]
    stop_pids([p for root in roots for p in descendants(root, table)] + roots)


def test_two_runs_report_and_verify_from_a_checkout_leave_it_unchanged(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PUBSWAP_OUTPUT_ROOT", "XDG_DATA_HOME", *superlink.USER_VARIABLES)}
    # No bytecode: Python's own __pycache__ is not the project's writing.
    env.update(HOME=str(home), PYTHONPATH=str(checkout), FLWR_TELEMETRY_ENABLED="0", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1")
    own_home = superlink.own_home(checkout, env)
    assert own_home.parent == home / ".local" / "share" / "pubswap" / "superlink"
    before = listing(checkout)
    assert git_status(checkout) == ""

    def pubswap(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pubswap_flwr.cli", *args], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    run_dirs = []
    try:
        for attempt in range(2):  # the first starts the checkout's SuperLink, the second finds it running
            done = pubswap("run", "-c", "configs/smoke.toml", "-c", f"{TINY} seed={attempt}", "--nodes", "2")
            assert done.returncode == 0, f"run {attempt + 1}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            port = superlink.recorded_ports(own_home)[0]
            assert done.stdout.startswith(f"SuperLink: this checkout's own SuperLink on 127.0.0.1:{port} "
                                          f"(FLWR_HOME={own_home}): " + ("not running" if attempt == 0 else "running"))
            run_id = re.search(r"^run (\d+) submitted", done.stdout, re.M).group(1)
            assert f"run {run_id}: finished:completed" in done.stdout
            assert "default simulated SuperNodes changed" not in done.stdout  # the streamed log's noise filter
            run_dirs.append(home / ".local" / "share" / "pubswap" / "runs" / f"fedavg-s{attempt}-{run_id}")
            assert (run_dirs[-1] / "adapters" / "final" / "adapter_model.safetensors").is_file()
        done = pubswap("superlink", "stop")
        assert done.returncode == 0 and done.stdout.startswith("stopped this checkout's own SuperLink (pid "), \
            done.stderr
    finally:
        if (ports := superlink.recorded_ports(own_home, quiet=True)) is not None:
            stop_superlink(ports[0])
    assert list((own_home / "apps").iterdir())  # Flower's app store is in the checkout's own SuperLink home

    done = pubswap("report", str(run_dirs[0]))
    assert done.returncode == 0, done.stderr
    report_dir = run_dirs[0].parent / "report"
    assert done.stdout.strip() == f"report: {report_dir / 'report.md'}" and (report_dir / "summary.json").is_file()

    done = pubswap("verify", str(run_dirs[-1]), "--items-per-task", "2")
    assert done.returncode == 0, done.stderr
    assert "global adapter" in done.stdout and "verify [0 s]: 1 adapter(s) of" in done.stderr

    assert listing(checkout) == before
    assert git_status(checkout) == ""
