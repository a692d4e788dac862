"""What the answers look like, for the OpenAPI document (/docs, /openapi.json, schemathesis).

Handlers build their answers as plain dicts (``server.shapes``) and write them with orjson; these
models only describe them: Qdrant's ``{"result", "status": "ok", "time"}`` envelope around each
result type, and ``{"status": {"error"}, "time"}`` for every refusal. ``documented(model)`` is
the ``responses=`` argument of a route: its 200 and the error codes any route may answer.

Thread-safety: immutable value classes.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, StrictInt, StrictStr

__all__ = [
    "CollectionList",
    "Count",
    "Existence",
    "KeyCreated",
    "KeyInfo",
    "KeyList",
    "QueryResult",
    "Record",
    "RootInfo",
    "ScoredPoint",
    "UpdateResult",
    "documented",
]

T = TypeVar("T")


class Envelope(BaseModel, Generic[T]):
    result: T
    status: Literal["ok"]
    time: float


class ErrorStatus(BaseModel):
    error: str


class ErrorEnvelope(BaseModel):
    status: ErrorStatus
    time: float


class RootInfo(BaseModel):
    title: str
    version: str


class CollectionName(BaseModel):
    name: str


class CollectionList(BaseModel):
    collections: list[CollectionName]


class Existence(BaseModel):
    exists: bool


class UpdateResult(BaseModel):
    operation_id: int
    status: Literal["acknowledged", "completed"]
    changed: int | None = None  # grant/revoke: how many points changed


class Record(BaseModel):
    id: StrictInt | StrictStr
    payload: dict[str, Any] | None = None
    vector: list[float] | None = None


class ScoredPoint(Record):
    version: int
    score: float | None  # null only where a score is not a finite number


class QueryResult(BaseModel):
    points: list[ScoredPoint]


class ScrollResult(BaseModel):
    points: list[Record]
    next_page_offset: StrictInt | StrictStr | None = None


class Count(BaseModel):
    count: int


class KeyInfo(BaseModel):
    key_id: str
    role: Literal["admin", "tenant"]
    tenant: str | None
    max_points: int | None
    rps: float | None
    revoked: bool
    created_at: float


class KeyCreated(KeyInfo):
    key: str  # shown once


class KeyList(BaseModel):
    keys: list[KeyInfo]


_ERRORS = {
    400: "bad input: the message names the field",
    401: "no API key, or not one of ours",
    403: "revoked key, not the admin, another tenant's point, or a quota",
    404: "no such collection, point or key",
    409: "a collection of that name exists",
    413: "request body too large",
    429: "rate limit: retry after Retry-After seconds",
    503: "starting or stopping",
    504: "request timed out",
}


def documented(model: Any) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route answering ``Envelope[model]``."""
    responses: dict[int | str, dict[str, Any]] = {200: {"model": Envelope[model]}}
    for code, description in _ERRORS.items():
        responses[code] = {"model": ErrorEnvelope, "description": description}
    return responses
