"""Default output places: run directories, sweep results and reports never land inside the project's checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubswap_flwr import cli
from pubswap_flwr.compare import default_report_dir
from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.places import checkout_root, output_root, resolve_output, user_data_dir

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    """A private user data directory, and no $PUBSWAP_OUTPUT_ROOT."""
    monkeypatch.delenv("PUBSWAP_OUTPUT_ROOT", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "pubswap"


def fake_checkout(folder: Path, name: str = "pubswap-flwr") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    return folder


def test_the_project_checkout_is_recognised_from_any_folder_inside_it():
    assert checkout_root(PROJECT) == PROJECT
    assert checkout_root(PROJECT / "pubswap_flwr" / "policy") == PROJECT


def test_nearest_pyproject_decides_and_a_broken_one_is_not_the_project(tmp_path):
    outer = fake_checkout(tmp_path / "co")
    assert checkout_root(outer / "runs" / "x") == outer  # need not exist
    other = fake_checkout(outer / "vendored", name="something-else")
    assert checkout_root(other / "sub") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "pyproject.toml").write_text("[project\n")
    assert checkout_root(tmp_path / "broken") is None
    assert checkout_root(tmp_path) is None


def test_user_data_dir_follows_xdg_else_home(tmp_path):
    assert user_data_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "pubswap"
    assert user_data_dir({}) == Path.home() / ".local" / "share" / "pubswap"


def test_output_root_order(tmp_path):
    checkout = fake_checkout(tmp_path / "co")
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    assert output_root(env, cwd=tmp_path / "elsewhere") == tmp_path / "elsewhere"
    assert output_root(env, cwd=checkout / "docs") == tmp_path / "data" / "pubswap"
    assert output_root({**env, "PUBSWAP_OUTPUT_ROOT": str(tmp_path / "mine")}, cwd=checkout) == tmp_path / "mine"
    # an absolute path is the user's choice, even inside the checkout
    assert resolve_output(checkout / "runs", env, cwd=tmp_path) == (checkout / "runs").resolve()
    assert resolve_output("results", env, cwd=checkout) == (tmp_path / "data" / "pubswap" / "results").resolve()


def test_a_run_started_from_the_checkout_writes_under_the_user_data_dir(data_home, monkeypatch):
    monkeypatch.chdir(PROJECT)
    cfg = ExperimentConfig()
    assert cfg.output.dir == "runs"
    assert cfg.run_dir(7) == (data_home / "runs" / "fedavg-s0-7").resolve()


def test_a_run_started_elsewhere_still_writes_beside_the_cwd(data_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ExperimentConfig().run_dir(7) == (tmp_path / "runs" / "fedavg-s0-7").resolve()


def test_pubswap_run_from_the_checkout_hands_flower_an_output_dir_outside_it(data_home, monkeypatch):
    submitted = {}

    def submit(app, overrides, federation, env, connection=None):
        from flwr.common.config import parse_config_args

        submitted.update(parse_config_args(overrides))
        raise cli.FlowerRunError("stop here")

    monkeypatch.setattr(cli, "submit", submit)
    monkeypatch.chdir(PROJECT)
    assert cli.main(["run", ".", "-c", "seed=4", "--nodes", "3"]) == 1
    assert submitted["output.dir"] == str((data_home / "runs").resolve())


def test_report_defaults_leave_the_checkout(data_home, tmp_path):
    outside = tmp_path / "w" / "runs" / "fedavg-s0"
    assert default_report_dir(outside) == (tmp_path / "w" / "runs" / "report").resolve()
    published = PROJECT / "docs" / "results" / "real-fedavg" / "runs" / "fedavg-s0"
    expected = data_home / "reports" / "docs" / "results" / "real-fedavg"
    assert (published.parent.parent / "outcomes.json").is_file()  # a published sweep keeps its outcomes.json
    assert default_report_dir(published) == expected
    assert default_report_dir(PROJECT / "runs" / "x") == data_home / "reports" / "runs" / "report"


def test_pubswap_simulate_out_from_the_checkout_lands_outside_it(data_home, monkeypatch):
    """`pubswap simulate -c configs/real.toml --out runs` (the README's real-model command) from the checkout: the
    relative --out resolves like output.dir, not into the checkout (the fresh-clone walk found runs/ there)."""
    seen = {}

    def simulate(config, nodes, **_):
        seen.update(config)

    monkeypatch.setattr("pubswap_flwr.simulation.simulate", simulate)
    monkeypatch.chdir(PROJECT)
    cli.main(["simulate", "--out", "runs", "--run-name", "walk", "-c", "seed=4", "--nodes", "3"])
    assert seen["output.dir"] == str((data_home / "runs").resolve())
