"""Where the project writes by default: never into a checkout of the project itself.

A relative `output.dir` (default `runs`) and `pubswap compare --out` (default `results`) resolve against
$PUBSWAP_OUTPUT_ROOT when set, else against the working directory, unless that directory lies inside a checkout of
pubswap-flwr (the folder `flwr run .` bundles into the app and git tracks): then against the per-user data directory
($XDG_DATA_HOME/pubswap, default ~/.local/share/pubswap), so `pubswap run` from the checkout, as the README shows it,
leaves the checkout as it was.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Mapping

OUTPUT_ROOT_ENV = "PUBSWAP_OUTPUT_ROOT"
PROJECT_NAME = "pubswap-flwr"  # [project].name in the checkout's pyproject.toml


def user_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_DATA_HOME/pubswap, default ~/.local/share/pubswap."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "pubswap"


def checkout_root(path: str | Path) -> Path | None:
    """The checkout of this project that holds `path` (the nearest folder up with a pyproject.toml naming
    pubswap-flwr), or None. A pyproject.toml that is unreadable or not TOML is not this project's."""
    here = Path(path).expanduser().resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            name = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("name")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        return folder if name == PROJECT_NAME else None  # the nearest project decides
    return None


def output_root(env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Path:
    """What a relative output path resolves against (the module docstring)."""
    env = os.environ if env is None else env
    if env.get(OUTPUT_ROOT_ENV):
        return Path(env[OUTPUT_ROOT_ENV]).expanduser()
    here = Path(cwd if cwd is not None else os.getcwd())
    return user_data_dir(env) if checkout_root(here) is not None else here


def resolve_output(path: str | Path, env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Path:
    """`path` made absolute: as given when absolute (even inside a checkout: the user named it), else under
    output_root()."""
    path = Path(path).expanduser()
    return (path if path.is_absolute() else output_root(env, cwd) / path).resolve()


def outside_checkout(target: Path, env: Mapping[str, str] | None = None) -> Path:
    """`target` when it lies outside any checkout of the project, else the same place under the user data
    directory's reports/ (named by its path inside the checkout), for output the user did not name."""
    root = checkout_root(target)
    if root is None:
        return target
    return user_data_dir(env) / "reports" / Path(target).resolve().relative_to(root)
