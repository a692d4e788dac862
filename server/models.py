"""The request bodies, as pydantic models: Qdrant's field names and shapes (qdrant-client 1.20),
so that /openapi.json and /docs describe them and bad types are refused with the field's name.

Fields Qdrant has and tierkit does not use (``hnsw_config``, ``shard_key``, ``consistency``...)
are accepted and ignored (``extra="allow"``); fields whose meaning tierkit cannot honour are
refused where a handler reads them. Filters stay free-form JSON here: ``parse_filter`` checks
them and names the failing part.

Thread-safety: immutable value classes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

__all__ = [
    "Batch",
    "CountBody",
    "CreateCollectionBody",
    "CreateIndexBody",
    "CreateKeyBody",
    "DeleteBody",
    "GrantBody",
    "PointId",
    "PointStruct",
    "QueryBatchBody",
    "QueryBody",
    "RetrieveBody",
    "SearchBody",
    "UpsertBody",
    "VectorParams",
]

PointId = StrictInt | StrictStr  # an int in [0, 2**63) or a UUID; the collection checks which
# StrictFloat takes JSON integers too, but not booleans or strings (lax float would)
Vector = Annotated[list[StrictFloat], Field(min_length=1)]
FilterJson = dict[str, Any]
# with_payload: true/false, a list of fields, or {"include": [...]} / {"exclude": [...]}
WithPayload = StrictBool | list[StrictStr] | dict[str, list[StrictStr]]
WithVector = StrictBool | list[StrictStr]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class VectorParams(_Body):
    size: StrictInt = Field(ge=1, le=65536)
    distance: Literal["Cosine", "Dot", "Euclid"]
    datatype: Literal["float32", "float16"] | None = None


class CreateCollectionBody(_Body):
    vectors: VectorParams


class CreateIndexBody(_Body):
    field_name: StrictStr = Field(min_length=1)
    field_schema: StrictStr | dict[str, Any] = "keyword"


class PointStruct(_Body):
    id: PointId
    vector: Vector
    payload: dict[str, Any] | None = None


class Batch(_Body):
    ids: list[PointId]
    vectors: list[Vector]
    payloads: list[dict[str, Any] | None] | None = None


class UpsertBody(_Body):
    """``points`` (a list of points) or ``batch`` (columns), not both."""

    points: list[PointStruct] | None = None
    batch: Batch | None = None

    @model_validator(mode="after")
    def _one_form(self) -> UpsertBody:
        if (self.points is None) == (self.batch is None):
            raise ValueError("give either points or batch")
        return self


class RetrieveBody(_Body):
    ids: list[PointId]
    with_payload: WithPayload | None = True
    with_vector: WithVector | None = False


class DeleteBody(_Body):
    """``points`` (ids) or ``filter``, not both."""

    points: list[PointId] | None = None
    filter: FilterJson | None = None

    @model_validator(mode="after")
    def _one_form(self) -> DeleteBody:
        if (self.points is None) == (self.filter is None):
            raise ValueError("give either points or filter")
        return self


class ScrollBody(_Body):
    """A page of points in id order from ``offset`` (a point id) on; ``order_by`` is not
    supported (refused, not ignored)."""

    offset: PointId | None = None
    limit: StrictInt | None = Field(default=10, ge=1, le=10_000)
    filter: FilterJson | None = None
    with_payload: WithPayload | None = True
    with_vector: WithVector | None = False
    order_by: Any = None


class CountBody(_Body):
    filter: FilterJson | None = None
    exact: StrictBool | None = True


class SearchParams(_Body):
    exact: StrictBool | None = False
    hnsw_ef: StrictInt | None = None


class _QueryCommon(_Body):
    limit: StrictInt | None = Field(default=10, ge=0, le=10_000)
    offset: StrictInt | None = Field(default=0, ge=0, le=100_000)
    filter: FilterJson | None = None
    with_payload: WithPayload | None = False
    with_vector: WithVector | None = False
    score_threshold: StrictFloat | None = None
    params: SearchParams | None = None


class QueryBody(_QueryCommon):
    """``query``: a vector, a point id (that point's vector), or ``{"nearest": either}`` (what
    qdrant-client sends)."""

    query: Vector | PointId | dict[str, Any]
    using: StrictStr | None = None
    prefetch: Any = None


class QueryBatchBody(_Body):
    searches: list[QueryBody]


class SearchBody(_QueryCommon):
    """The legacy ``/points/search`` body: ``vector`` instead of ``query``."""

    vector: Vector


class GrantBody(_Body):
    tenant: StrictStr = Field(min_length=1, max_length=128)
    points: list[PointId]


class CreateKeyBody(_Body):
    tenant: StrictStr = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")
    max_points: StrictInt | None = Field(default=None, ge=0)
    rps: StrictFloat | None = Field(default=None, gt=0, le=1e6)
