"""One mechanism for the project's pluggable, named things (server optimizers, tracker backends, verifiers, data-file
formats), after verl's `@register_...("name")`: a Registry maps names to entries, filled at import by its
`register` decorator (or `add`), read by name with `lookup`, whose error lists the known names. The protocol catalog
(config/catalog.py) is the one richer declaration beside it: a mode declares more than one entry. Imports nothing
of the package."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Callable, TypeVar

T = TypeVar("T")


class Registry(MutableMapping[str, T]):
    """Named entries of one `kind`. A name is registered once unless `replace` (a user may override a built-in
    verifier or data format by registering its name again)."""

    def __init__(self, kind: str, entries: Mapping[str, T] | None = None, *, replace: bool = False):
        self.kind = kind
        self.replace = replace
        self._entries: dict[str, T] = dict(entries or {})

    def add(self, name: str, entry: T) -> T:
        if not self.replace and name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `entry` under `name`."""
        return lambda entry: self.add(name, entry)

    def lookup(self, name: str, error: type[Exception] = ValueError, where: str = "") -> T:
        """The entry of `name`; `error` naming the known ones when there is none."""
        if name not in self._entries:
            raise error(f"{where}{': ' if where else ''}unknown {self.kind} {name!r}; known: "
                        f"{', '.join(sorted(self._entries))}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry  # as a mapping (tests patch an entry in): no duplicate check

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
