"""TenantNames: the caller's opaque tenant ids and the index's dense tenant numbers.

A tenant id is an integer >= 0 or a non-empty string; ``5`` and ``"5"`` are different tenants.
Numbers are given in order of first use (0, 1, ...) and never reused, so a write-ahead log
record that names its tenants replays to the same numbers as it was first applied with.
Checkpointed as one JSON list (index = number).

Thread-safety: loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from vectordb.errors import InvalidTenantError

__all__ = ["TenantId", "TenantNames", "check_tenant"]

TenantId = int | str
_MAX_NAME_CHARS = 1024


def check_tenant(value: Any) -> TenantId:
    """``value`` as a plain int or str, or InvalidTenantError."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidTenantError(f"a tenant id is an int >= 0 or a str, got {value!r}")
    if isinstance(value, (int, np.integer)):
        if value < 0 or value >= 2**63:
            raise InvalidTenantError(f"a tenant id is an int >= 0 or a str, got {value!r}")
        return int(value)
    if isinstance(value, str):
        if not value or len(value) > _MAX_NAME_CHARS:
            raise InvalidTenantError(
                f"a tenant name has 1 to {_MAX_NAME_CHARS} characters, got {len(value)}"
            )
        return value
    raise InvalidTenantError(f"a tenant id is an int >= 0 or a str, got {type(value).__name__}")


class TenantNames:
    def __init__(self, names: Iterable[TenantId] = ()) -> None:
        self.names: list[TenantId] = list(names)
        self._numbers = {name: number for number, name in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def number(self, name: TenantId) -> int | None:
        """The tenant's number, None if it was never used."""
        return self._numbers.get(name)

    def numbers(self, names: Iterable[TenantId]) -> np.ndarray:
        """int64 numbers of checked names, -1 for names never used (searches only)."""
        return np.fromiter((self._numbers.get(n, -1) for n in names), np.int64)

    def number_or_new(self, name: TenantId) -> int:
        number = self._numbers.get(name)
        if number is None:
            number = self._numbers[name] = len(self.names)
            self.names.append(name)
        return number

    def name(self, number: int) -> TenantId:
        return self.names[number]

    def snapshot(self) -> list[TenantId]:
        return list(self.names)
