"""The one registry mechanism: named entries filled by a decorator, a second registration refused unless the registry
replaces, a lookup that names the known entries, and the project's four registries built on it."""

from __future__ import annotations

import pytest

from pubswap_flwr.registry import Registry


def test_entries_are_registered_by_decorator_and_looked_up_by_name():
    things = Registry("thing")

    @things.register("double")
    def double(x):
        return 2 * x

    assert things.lookup("double") is double and things["double"](3) == 6 and list(things) == ["double"]
    with pytest.raises(ValueError, match="thing 'double' is already registered"):
        things.add("double", abs)
    with pytest.raises(KeyError, match="where: unknown thing 'triple'; known: double"):
        things.lookup("triple", KeyError, "where")


def test_a_replacing_registry_takes_the_latest_entry():
    formats = Registry("format", {"a": 1}, replace=True)
    formats.add("a", 2)
    assert formats["a"] == 2 and len(formats) == 1


def test_the_projects_registries_share_the_mechanism():
    from pubswap_flwr.algorithms.server_optimizers import OPTIMIZERS
    from pubswap_flwr.server.trackers import BACKENDS
    from pubswap_flwr.tasks.files import ADAPTERS
    from pubswap_flwr.tasks.specs import TaskError
    from pubswap_flwr.tasks.verifiers import VERIFIERS, check_verifier

    assert all(isinstance(r, Registry) for r in (OPTIMIZERS, BACKENDS, ADAPTERS, VERIFIERS))
    assert {"none", "fedavgm", "fedadam"} <= set(OPTIMIZERS) and {"rg", "exact", "numeric"} <= set(VERIFIERS)
    with pytest.raises(ValueError, match="server optimizer 'none' is already registered"):
        OPTIMIZERS.add("none", OPTIMIZERS["none"])
    with pytest.raises(TaskError, match="row 3: unknown verifier 'judge'; known: .*exact"):
        check_verifier("judge", "row 3")
