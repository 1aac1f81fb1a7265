"""A repository script (scripts/, benchmarks/) loaded as a module by its path, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """The script at `relative` (to the repository root), executed as a module named after its file."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get(spec.name)
    sys.modules[spec.name] = module  # while it runs: a dataclass with string annotations looks its module up there
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            sys.modules.pop(spec.name, None)
        else:
            sys.modules[spec.name] = before
    return module
