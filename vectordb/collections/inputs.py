"""Checks of what callers pass a collection: point ids, vectors, payloads, tenant names.

Each returns the value in the form the collection works with, or raises the typed error
(InvalidPointError, InvalidVectorsError) before anything is written.

Thread-safety: pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from vectordb.collections.errors import InvalidPointError
from vectordb.collections.points import CollectionConfig, PointId, check_point_id
from vectordb.errors import InvalidVectorsError

__all__ = ["check_payloads", "check_point_ids", "check_tenant", "check_vectors"]

_MAX_TENANT_CHARS = 1000


def check_point_ids(ids: Any, unique: bool = True) -> list[PointId]:
    """The ids, each once in first-seen order; ``unique``: an id twice is an error (an upsert
    of one id with two vectors has no single meaning)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise InvalidPointError(f"expected a list of point ids, got {type(ids).__name__}")
    out = [check_point_id(i.item() if isinstance(i, np.generic) else i) for i in ids]
    once = list(dict.fromkeys(out))
    if unique and len(once) != len(out):
        raise InvalidPointError("a point id appears twice in one call")
    return once


def check_vectors(config: CollectionConfig, vectors: Any, n: int | None) -> np.ndarray:
    """float32 [rows, dim] (a single vector is one row), normalised for Cosine; ``n``: the
    rows expected (None: any)."""
    try:
        matrix = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidVectorsError(f"vectors must be numbers: {exc}") from None
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if matrix.ndim != 2 or matrix.shape[1] != config.dim:
        raise InvalidVectorsError(
            f"expected vectors of size {config.dim}, got shape {matrix.shape}"
        )
    if n is not None and len(matrix) != n:
        raise InvalidVectorsError(f"{len(matrix)} vectors for {n} ids")
    if not np.isfinite(matrix).all():
        raise InvalidVectorsError("vectors hold NaN or infinity (or exceed float32)")
    if config.distance == "Cosine":
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return np.ascontiguousarray(matrix)


def check_payloads(payloads: Any, n: int) -> list[dict[str, Any] | None]:
    if payloads is None:
        return [None] * n
    rows = list(payloads)
    if len(rows) != n:
        raise InvalidPointError(f"{len(rows)} payloads for {n} points")
    for row in rows:
        if row is not None and not isinstance(row, dict):
            raise InvalidPointError(f"a payload is a JSON object, got {type(row).__name__}")
        try:
            orjson.dumps(row)
        except TypeError as exc:
            raise InvalidPointError(f"a payload must be JSON: {exc}") from None
    return rows


def check_tenant(tenant: Any) -> str | None:
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not tenant or len(tenant) > _MAX_TENANT_CHARS:
        raise InvalidPointError(f"a tenant is a non-empty string of <= {_MAX_TENANT_CHARS} chars")
    return tenant
