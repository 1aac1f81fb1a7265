"""README.md's claims that name defaults, read from its text and checked against the config's defaults: the mode
table (every mode, the default aggregation), every quoted `key = value`, the default job's run folder and
configs/real.toml's rounds. A changed default fails here until the README says the new one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from pubswap_flwr.config import describe, key_choices
from pubswap_flwr.config.keys import load_toml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEFAULTS = {key: default for key, default, _doc in describe()}
QUOTED = re.compile(r"`([a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*) = ([^`]+)`")


def _mode_table() -> dict[str, str]:
    """{mode: the row's text} of the README's first table, the one headed `| mode |`."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| mode |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1].strip()
        rows[cell.strip("`")] = line
    return rows


def _quoted_claims(text: str) -> list[tuple[str, str]]:
    return [(key, value) for key, value in QUOTED.findall(text) if key in DEFAULTS]


def test_the_mode_table_lists_every_mode_once():
    assert sorted(_mode_table()) == sorted(key_choices()["strategy.mode"])


def test_the_default_modes_row_names_the_default_aggregation():
    row = _mode_table()[DEFAULTS["strategy.mode"]]
    assert f'`strategy.aggregation = "{DEFAULTS["strategy.aggregation"]}"`' in row, row


def test_the_readme_quotes_defaults():
    claims = _quoted_claims(README)
    assert {"strategy.aggregation", "num-server-rounds"} <= {key for key, _ in claims}  # the parser finds them
    for key, value in claims:
        assert tomllib.loads(f"v = {value}")["v"] == DEFAULTS[key], f"README says `{key} = {value}`"


def test_a_changed_default_is_caught():
    text = README.replace('`strategy.aggregation = "geometric-median"`', '`strategy.aggregation = "mean"`')
    assert text != README
    assert any(tomllib.loads(f"v = {value}")["v"] != DEFAULTS[key] for key, value in _quoted_claims(text))


def test_the_default_jobs_run_folder_is_named_by_the_default_mode_and_seed():
    [(mode, seed)] = set(re.findall(r"runs/([a-z]+)-s(\d+)-<run id>", README))
    assert (mode, int(seed)) == (DEFAULTS["strategy.mode"], DEFAULTS["seed"])
    assert "default job" in README and str(DEFAULTS["model.name"]).startswith("embedded:")


@pytest.mark.parametrize("config", ["configs/real.toml"])
def test_a_configs_rounds_and_mode_as_the_readme_says(config):
    claim = re.search(rf"`{re.escape(config)}` trains .*? with (\w+)-GRPO on \d+ clients for (\d+) rounds",
                      README, re.S)
    assert claim is not None, f"README describes {config}"
    values = {**DEFAULTS, **load_toml(ROOT / config)}
    assert (claim[1].lower(), int(claim[2])) == (values["strategy.mode"], values["num-server-rounds"])

