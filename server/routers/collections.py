"""Collections: create, list, describe, check, delete, and keyword payload indexes.

Creating, deleting and indexing a collection is the admin's (a tenant would change what other
tenants share); listing and describing is anyone's, and a tenant's ``points_count`` counts only
the points it can read. ``GET /collections/{name}`` is Qdrant's ``CollectionInfo`` shape with
fixed values where tierkit has no such setting (segments, HNSW and WAL configuration).

Thread-safety: handlers run on the event loop; blocking work goes to worker threads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from server.deps import Admin, Caller, CatalogDep, CollectionDep, shielded
from server.envelope import OrjsonRoute, ok
from server.errors import ApiError
from server.models import CreateCollectionBody, CreateIndexBody
from server.responses import CollectionList, Existence, UpdateResult, documented
from vectordb.collections import Collection, CollectionConfig

__all__ = ["router"]

router = APIRouter(tags=["collections"], route_class=OrjsonRoute)


@router.get("/collections", summary="List collections", responses=documented(CollectionList))
async def list_collections(request: Request, _: Caller, catalog: CatalogDep) -> Response:
    names = sorted(catalog.names())
    return ok({"collections": [{"name": name} for name in names]}, request)


@router.put(
    "/collections/{collection_name}", summary="Create a collection", responses=documented(bool)
)
async def create_collection(
    request: Request,
    collection_name: str,
    body: CreateCollectionBody,
    _: Admin,
    catalog: CatalogDep,
) -> Response:
    vectors = body.vectors
    config = CollectionConfig(vectors.size, vectors.distance, vectors.datatype or "float32")
    await shielded(catalog.create(collection_name, config))
    return ok(True, request)


@router.get(
    "/collections/{collection_name}/exists",
    summary="Does a collection exist",
    responses=documented(Existence),
)
async def collection_exists(
    request: Request, collection_name: str, _: Caller, catalog: CatalogDep
) -> Response:
    return ok({"exists": collection_name in catalog.names()}, request)


@router.delete(
    "/collections/{collection_name}", summary="Delete a collection", responses=documented(bool)
)
async def delete_collection(
    request: Request, collection_name: str, _: Admin, catalog: CatalogDep
) -> Response:
    return ok(await shielded(catalog.delete(collection_name)), request)


def _info_json(collection: Collection, info: dict[str, Any], points: int) -> dict[str, Any]:
    config = collection.config
    indexes = info.get("payload_indexes", [])
    return {
        "status": info.get("status", "green"),
        "optimizer_status": "ok",
        "indexed_vectors_count": points,
        "points_count": points,
        "segments_count": 1,
        "config": {
            "params": {
                "vectors": {
                    "size": config.dim,
                    "distance": config.distance,
                    "datatype": config.dtype,
                },
                "shard_number": 1,
                "replication_factor": 1,
                "write_consistency_factor": 1,
                "on_disk_payload": True,
            },
            "hnsw_config": {"m": 0, "ef_construct": 0, "full_scan_threshold": 0},
            "optimizer_config": {"default_segment_number": 1, "flush_interval_sec": 0},
            "wal_config": {"wal_capacity_mb": 0, "wal_segments_ahead": 0},
        },
        "payload_schema": {field: {"data_type": "keyword", "points": points} for field in indexes},
    }


@router.get(
    "/collections/{collection_name}",
    summary="Describe a collection",
    responses=documented(dict[str, Any]),
)
async def get_collection(request: Request, caller: Caller, collection: CollectionDep) -> Response:
    info = collection.info()
    if caller.is_admin:
        points = int(info.get("points_count", 0))
    else:  # the total would tell a tenant how much the others hold
        points = await collection.count(tenant=caller.tenant)
    return ok(_info_json(collection, info, points), request)


@router.put(
    "/collections/{collection_name}/index",
    summary="Create a keyword payload index",
    responses=documented(UpdateResult),
)
async def create_index(
    request: Request, body: CreateIndexBody, _: Admin, collection: CollectionDep
) -> Response:
    schema = body.field_schema
    kind = schema if isinstance(schema, str) else schema.get("type")
    if kind != "keyword":
        raise ApiError(400, f"field_schema: only keyword indexes are supported, got {kind!r}")
    await shielded(collection.create_payload_index(body.field_name))
    operation_id = request.app.state.next_operation_id()
    return ok({"operation_id": operation_id, "status": "completed"}, request)
