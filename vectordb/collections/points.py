"""The values a collection takes and returns: its configuration, points and scored hits.

A point id is an integer in [0, 2**63) or a UUID (any form ``uuid.UUID`` parses; returned in
the canonical hyphenated lower-case form), as in Qdrant. Payloads are JSON objects.

Thread-safety: frozen values; the functions are pure.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from vectordb.collections.errors import InvalidCollectionError, InvalidPointError

__all__ = [
    "DISTANCES",
    "CollectionConfig",
    "Point",
    "PointId",
    "ScoredPoint",
    "check_point_id",
    "point_from_key",
    "point_key",
]

PointId = int | str
# Qdrant's distance names -> the index's metric
DISTANCES = {"Cosine": "cosine", "Dot": "ip", "Euclid": "l2"}
_DTYPES = ("float32", "float16")
_MAX_DIM = 65536


@dataclass(frozen=True)
class CollectionConfig:
    """``dim``: vector size; ``distance``: "Cosine" | "Dot" | "Euclid"; ``dtype``: how posting
    lists keep vectors ("float32" or "float16": half the disk and reads, ~1e-3 score error)."""

    dim: int
    distance: str = "Cosine"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise InvalidCollectionError(f"vectors.size must be an integer, got {self.dim!r}")
        if not 1 <= self.dim <= _MAX_DIM:
            raise InvalidCollectionError(f"vectors.size must be in 1..{_MAX_DIM}, got {self.dim}")
        if self.distance not in DISTANCES:
            raise InvalidCollectionError(
                f"vectors.distance must be one of {sorted(DISTANCES)}, got {self.distance!r}"
            )
        if self.dtype not in _DTYPES:
            raise InvalidCollectionError(f"datatype must be one of {_DTYPES}, got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "distance": self.distance, "dtype": self.dtype}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CollectionConfig:
        return cls(int(values["dim"]), str(values["distance"]), str(values["dtype"]))


@dataclass(frozen=True)
class Point:
    """A stored point as retrieve returns it (``payload``/``vector`` None when not asked)."""

    id: PointId
    payload: dict[str, Any] | None = None
    vector: list[float] | None = None


@dataclass(frozen=True)
class ScoredPoint:
    """A query hit. ``score``: similarity (Cosine, Dot: larger is nearer) or Euclidean
    distance (Euclid: smaller is nearer), as Qdrant reports them."""

    id: PointId
    score: float
    payload: dict[str, Any] | None = None
    vector: list[float] | None = field(default=None)


def check_point_id(value: Any) -> PointId:
    """``value`` as a point id (an int, or a UUID's canonical string), or InvalidPointError."""
    if isinstance(value, bool):
        raise InvalidPointError(f"a point id is an integer >= 0 or a UUID, got {value!r}")
    if isinstance(value, int):
        if not 0 <= value < 2**63:
            raise InvalidPointError(f"a point id is an integer in [0, 2**63), got {value}")
        return value
    if isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            raise InvalidPointError(
                f"a point id is an integer >= 0 or a UUID, got {value[:64]!r}"
            ) from None
    raise InvalidPointError(f"a point id is an integer >= 0 or a UUID, got {type(value).__name__}")


def point_key(point_id: PointId) -> bytes:
    """The id's key in the point store: 9 bytes for an integer, 17 for a UUID (a type byte
    first, so integer 5 and a UUID never collide)."""
    if isinstance(point_id, int):
        return b"i" + point_id.to_bytes(8, "big")
    return b"u" + uuid.UUID(point_id).bytes


def point_from_key(key: bytes) -> PointId:
    """The point id whose :func:`point_key` is ``key``."""
    if key[:1] == b"i":
        return int.from_bytes(key[1:], "big")
    return str(uuid.UUID(bytes=key[1:]))
