"""The errors vectordb.collections adds to the tierkit tree (see vectordb.errors for the rest).

::

    TierkitError
     +- InvalidArgumentError (ValueError)
     |   +- InvalidVectorsError            wrong dimension, NaN/inf (vectordb.errors)
     |   +- InvalidPointError              a point id that is neither an int >= 0 nor a UUID,
     |   |                                 a payload that is not a JSON object, ids twice
     |   +- InvalidFilterError             a filter that does not parse; ``where`` names the part
     |   +- InvalidCollectionError         a bad collection name or configuration
     |   +- CollectionExistsError          create: the name is taken
     +- CollectionNotFoundError (KeyError) no collection of that name
     +- PointNotWritableError              a tenant's write to a point it may not change
     +- QuotaExceededError                 a tenant's points quota would be exceeded

Every check on caller input runs before anything is written: a refused call changes nothing.
"""

from __future__ import annotations

from tiers.io import InvalidArgumentError, TierkitError

__all__ = [
    "CollectionExistsError",
    "CollectionNotFoundError",
    "InvalidCollectionError",
    "InvalidFilterError",
    "InvalidPointError",
    "PointNotWritableError",
    "QuotaExceededError",
]


class InvalidPointError(InvalidArgumentError):
    """A point the collection cannot take: a bad id or payload, or an id twice in one call."""


class InvalidFilterError(InvalidArgumentError):
    """A filter that does not parse; ``where`` is its JSON path (``must[1].range``)."""

    def __init__(self, message: str, where: str = "filter") -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class InvalidCollectionError(InvalidArgumentError):
    """A collection name or configuration that cannot work."""


class CollectionExistsError(InvalidArgumentError):
    """A collection of that name exists already."""


class CollectionNotFoundError(TierkitError, KeyError):
    """No collection of that name."""

    def __str__(self) -> str:  # KeyError's str() quotes its argument
        return str(self.args[0]) if self.args else "collection not found"


class PointNotWritableError(TierkitError):
    """A tenant tried to overwrite or change a point it may not change (one of another tenant
    or of the admin). The message names no data of that point."""


class QuotaExceededError(TierkitError):
    """The write would take a tenant past its points quota; nothing was written."""
