"""The errors vectordb adds to the tierkit tree (see tiers.io.errors for the whole tree).

::

    TierkitError
     +- InvalidArgumentError (ValueError)
     |   +- InvalidVectorsError            wrong dimension, dtype, shape, NaN/inf; nothing written
     |   +- DuplicateIdError               an id twice in one call, or already in the index
     |   +- InvalidTenantError             a tenant id that is neither an int >= 0 nor a str
     |   +- ConfigError                    a wrong setting (tiers.io.errors); ``where`` names it
     |       +- IndexConfigError           an IndexConfig/SearchParams field that cannot work
     |                                     (zero dim, unknown metric), or an index not to be made
     +- EngineClosedError (RuntimeError)
     |   +- IndexClosedError               the index was closed
     +- CorruptionError                    a posting page, WAL record or metadata fails its check
     +- StorageError (OSError)             the OS failed (from tiers, unchanged)

Every check on caller input runs before anything is written, so a refused call leaves the index
exactly as it was.
"""

from __future__ import annotations

from tiers.io import (
    ConfigError,
    CorruptionError,
    EngineClosedError,
    InvalidArgumentError,
    StorageError,
    TierkitError,
)

__all__ = [
    "ConfigError",
    "CorruptionError",
    "DuplicateIdError",
    "IndexClosedError",
    "IndexConfigError",
    "InvalidTenantError",
    "InvalidVectorsError",
    "StorageError",
    "TierkitError",
]


class InvalidVectorsError(InvalidArgumentError):
    """Vectors or ids the index cannot take: wrong shape, dimension or dtype, NaN/inf."""


class DuplicateIdError(InvalidArgumentError):
    """An id appears twice in one call, or is already live in the index; ``ids`` lists some."""

    def __init__(self, message: str, ids: list[int]) -> None:
        super().__init__(message)
        self.ids = ids


class InvalidTenantError(InvalidArgumentError):
    """A tenant id that is neither an integer >= 0 nor a non-empty string, or tenant rows that
    do not match the vectors."""


class IndexConfigError(ConfigError):
    """An index configuration that cannot work; ``where`` names the field when there is one
    (``IndexConfig.dim``), so ``except ConfigError`` catches store and index settings alike."""


class IndexClosedError(EngineClosedError):
    """The index was closed before or during the call."""
