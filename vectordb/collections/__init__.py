"""vectordb.collections: named collections of points (id, vector, payload) over SpannIndex,
with tenants, payload filters and keyword payload indexes: what the REST service serves.

    catalog = await Catalog.open("data")            # every collection under data/collections/
    c = await catalog.create("docs", CollectionConfig(dim=384, distance="Cosine"))
    await c.upsert([1, 2], vectors, [{"lang": "en"}, {"lang": "de"}], tenant="acme")
    hits = await c.query(vectors[:1], limit=10, filter=parse_filter(
        {"must": [{"key": "lang", "match": {"value": "en"}}]}), tenant="acme")
    await c.create_payload_index("lang")            # keyword: filtered through index labels
    await catalog.aclose()

``tenant=None`` is the admin: it sees every point. A tenant (any non-empty str) sees only points
granted to it: those it upserted, and those the admin granted it (``grant``/``revoke``); the
index enforces it (a tenant's query searches only what its label may read). Filters narrow what
a caller sees, never widen it.
"""

from vectordb.collections.catalog import Catalog
from vectordb.collections.collection import Collection
from vectordb.collections.errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    InvalidCollectionError,
    InvalidFilterError,
    InvalidPointError,
    PointNotWritableError,
    QuotaExceededError,
)
from vectordb.collections.filters import Filter, parse_filter
from vectordb.collections.points import CollectionConfig, Point, PointId, ScoredPoint

__all__ = [
    "Catalog",
    "Collection",
    "CollectionConfig",
    "CollectionExistsError",
    "CollectionNotFoundError",
    "Filter",
    "InvalidCollectionError",
    "InvalidFilterError",
    "InvalidPointError",
    "Point",
    "PointId",
    "PointNotWritableError",
    "QuotaExceededError",
    "ScoredPoint",
    "parse_filter",
]
