"""Which variants of a check repeated over modes or settings run in the fast tier (`-m "not slow"`)."""

from __future__ import annotations

from typing import Any, Iterable

import pytest


def fast_only(values: Iterable[Any], fast: Iterable[Any]) -> list:
    """`values` for pytest.mark.parametrize, those not in `fast` marked slow. For checks whose every variant is a
    whole simulated run: the fast tier keeps the listed witnesses of the behaviour (and the goldens every mode's
    exact metrics), the full suite (CI) runs every variant. A name in `fast` that is not a value is an error."""
    values, fast = list(values), list(fast)
    missing = [value for value in fast if value not in values]
    if missing:
        raise ValueError(f"fast variants {missing} are not among {values}")
    return [value if value in fast else pytest.param(*(value if isinstance(value, tuple) else (value,)),
                                                     marks=pytest.mark.slow)
            for value in values]
