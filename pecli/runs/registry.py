"""A small name -> object registry with close-match suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Generic, TypeVar

from pecli.runs.errors import PecliError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; `get` of an unknown name suggests the closest ones.

    Args:
        kind: what the entries are ("model family", "intervention", ...), used in errors.
        error: the PecliError subclass raised for an unknown name.
    """

    def __init__(self, kind: str, error: type[PecliError] = PecliError):
        self.kind = kind
        self.error = error
        self._entries: dict[str, T] = {}
        self.renamed: dict[str, str] = {}  # a deprecated name -> its name now (kept one release)

    def add(self, name: str, obj: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = obj

    def rename(self, old: str, new: str) -> None:
        """Keep accepting `old` (pecli.runs.names.parse warns and reads it as `new`)."""
        self.get(new)
        self.renamed[old] = new

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._entries, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; known: {', '.join(self._entries)}"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def items(self):
        return self._entries.items()

    def values(self):
        return self._entries.values()

    def names(self) -> list[str]:
        return list(self._entries)
