"""The plain model of tenant isolation, and the HTTP helpers the isolation tests share.

The model says which tenant owns and may read which point; the state machine
(``isolation_machine.py``) and the scripted tests check every response against it.

The rules the model encodes (vectordb/collections/writes.py): a tenant's new point is its own
and readable by it alone; a tenant may overwrite and delete only points it owns, and a request
touching any other existing point is refused with 403 and changes nothing; deleting a point it
was only granted revokes its own grant; the admin's grants add a reader and revokes remove one
(revoking the owner leaves the point to the admin); a write never changes who may read a point.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from hypothesis import strategies as st

DIM = 4
PointId = int | str
# integers and UUIDs (canonical form: what the server returns)
ID_POOL: list[PointId] = [
    *range(1, 22),
    *(str(uuid.UUID(int=n * 0x1000_0000_0000_0001)) for n in (1, 2, 3)),
]


def ordered(ids: Any) -> list[PointId]:
    return sorted(ids, key=str)


def spelled(point_id: PointId) -> PointId:
    """A UUID in upper case: the same point to the server (it takes any form uuid parses)."""
    return point_id.upper() if isinstance(point_id, str) else point_id


TAGS = ["a", "b", "c"]
N_TENANTS = 3
BIG = 100  # every limit: more than any collection here holds
DENIED = (401, 403)
MAX_EXAMPLES, STEPS = 20, 50


@dataclass
class PointModel:
    owner: str | None
    readers: set[str]
    payload: dict[str, Any]
    vector: list[float]


@dataclass
class Model:
    points: dict[PointId, PointModel] = field(default_factory=dict)

    def visible(self, tenant: str | None) -> set[PointId]:
        if tenant is None:
            return set(self.points)
        return {i for i, p in self.points.items() if tenant in p.readers}


def matches(flt: dict[str, Any] | None, point_id: PointId, payload: dict[str, Any]) -> bool:
    from vectordb.collections import parse_filter

    parsed = parse_filter(flt)
    return parsed is None or parsed.matches(point_id, payload)


class Client:
    """One keep-alive HTTP client for the whole machine run."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30.0)

    def __call__(
        self, method: str, path: str, key: str | None, body: Any = None, **params: Any
    ) -> httpx.Response:
        headers = {"api-key": key} if key is not None else {}
        return self.http.request(method, path, headers=headers, json=body, params=params or None)


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, (
        f"{response.request.method} {response.request.url.path} "
        f"{response.request.content[:300]!r} -> {response.status_code}: {response.text[:300]}"
    )
    return response.json()["result"]


def assert_denied(response: httpx.Response) -> None:
    assert response.status_code in DENIED, (
        f"a revoked key got {response.status_code}: {response.text[:300]}"
    )
    body = response.text
    assert '"payload"' not in body and '"points"' not in body and '"vector"' not in body


def vector_of(seed: int) -> list[float]:
    """A vector from a small seed: float32 values, so storage returns them exactly."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in rng.uniform(-1, 1, DIM).astype(np.float32)]


# Draw seeds, not floats: a run stays small enough for hypothesis to keep every example.
vectors = st.integers(0, 10_000).map(vector_of)
some_ids = st.lists(st.sampled_from(ID_POOL), min_size=1, max_size=5, unique=True)


TENANTS = [f"tenant{i}" for i in range(N_TENANTS)]
