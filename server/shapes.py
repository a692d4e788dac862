"""Between JSON and the collection layer: vectors in, points and hits out, in Qdrant's shapes.

    vectors = as_matrix(rows, dim, "points")      # float32 [n, dim], or ApiError 400
    filter = as_filter(body.filter)               # nulls dropped, then parse_filter
    {"id": 1, "version": 0, "score": 0.9, "payload": {...}, "vector": None} = hit_json(hit, sel)

Payload selection (``with_payload``) is applied here: true/false, a list of fields, or
``{"include": [...]}`` / ``{"exclude": [...]}``. ``with_vector`` is true/false (a list names
named vectors, which tierkit does not have: any non-empty list means the one vector).

Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.errors import ApiError
from vectordb.collections import Filter, Point, ScoredPoint, parse_filter

__all__ = [
    "PayloadSelection",
    "as_filter",
    "as_matrix",
    "hit_json",
    "payload_selection",
    "point_json",
    "wants_vector",
]

# (wanted at all, fields to keep or None for all, fields to drop)
PayloadSelection = tuple[bool, frozenset[str] | None, frozenset[str]]


def as_matrix(rows: list[list[float]], dim: int, where: str) -> np.ndarray:
    """``rows`` as a float32 [n, dim] matrix; a row of another length is a 400 naming it."""
    for index, row in enumerate(rows):
        if len(row) != dim:
            raise ApiError(
                400, f"{where}[{index}]: vector has {len(row)} dimensions, the collection {dim}"
            )
    if not rows:
        return np.empty((0, dim), dtype=np.float32)
    with np.errstate(over="ignore"):  # a value past float32's range becomes inf: refused later
        return np.asarray(rows, dtype=np.float32)


def _without_nulls(value: Any) -> Any:
    """qdrant-client sends unset fields as null (``"should": null``): drop them."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def as_filter(value: dict[str, Any] | None) -> Filter | None:
    if value is None:
        return None
    return parse_filter(_without_nulls(value))


def payload_selection(with_payload: Any) -> PayloadSelection:
    if with_payload is None or with_payload is False:
        return (False, None, frozenset())
    if with_payload is True:
        return (True, None, frozenset())
    if isinstance(with_payload, list):
        return (True, frozenset(with_payload), frozenset())
    if isinstance(with_payload, dict) and set(with_payload) <= {"include", "exclude"}:
        include = with_payload.get("include")
        keep = frozenset(include) if include is not None else None
        return (True, keep, frozenset(with_payload.get("exclude") or ()))
    raise ApiError(400, "with_payload: give true, false, a list of fields, include or exclude")


def wants_vector(with_vector: Any) -> bool:
    return bool(with_vector)


def _payload(payload: dict[str, Any] | None, selection: PayloadSelection) -> Any:
    wanted, keep, drop = selection
    if not wanted:
        return None
    payload = payload or {}
    if keep is None and not drop:
        return payload
    return {k: v for k, v in payload.items() if (keep is None or k in keep) and k not in drop}


def _vector(vector: Any) -> Any:
    return vector.tolist() if isinstance(vector, np.ndarray) else vector


def point_json(point: Point, selection: PayloadSelection) -> dict[str, Any]:
    return {
        "id": point.id,
        "payload": _payload(point.payload, selection),
        "vector": _vector(point.vector),
    }


def hit_json(hit: ScoredPoint, selection: PayloadSelection) -> dict[str, Any]:
    return {
        "id": hit.id,
        "version": 0,
        "score": float(hit.score),
        "payload": _payload(hit.payload, selection),
        "vector": _vector(hit.vector),
    }
