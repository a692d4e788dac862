"""Points: upsert, retrieve, scroll, delete, count, query (one, batch, legacy search), grant/revoke.

Every call passes the caller's tenant to the collection (None for the admin), which enforces
what it may read and change: a tenant never sees, counts or deletes a point it was not granted,
whatever filter it sends. Writes are durable when they answer (``wait`` is accepted; every
write waits) and shielded from cancellation (see ``server.deps.shielded``).

Thread-safety: handlers run on the event loop; blocking work goes to worker threads.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request, Response

from server.deps import Admin, Caller, CollectionDep, shielded
from server.envelope import OrjsonRoute, ok
from server.errors import ApiError
from server.keys import Principal
from server.models import (
    CountBody,
    DeleteBody,
    GrantBody,
    QueryBatchBody,
    QueryBody,
    RetrieveBody,
    ScrollBody,
    SearchBody,
    UpsertBody,
)
from server.responses import (
    Count,
    QueryResult,
    Record,
    ScoredPoint,
    ScrollResult,
    UpdateResult,
    documented,
)
from server.shapes import (
    as_filter,
    as_matrix,
    hit_json,
    payload_selection,
    point_json,
    wants_vector,
)
from vectordb.collections import Collection

__all__ = ["QUERY_PATH", "router", "search"]

router = APIRouter(tags=["points"], route_class=OrjsonRoute)
_PREFIX = "/collections/{collection_name}/points"
QUERY_PATH = _PREFIX + "/query"
_MATRIX_IN_THREAD_FLOATS = 1 << 18


def _updated(request: Request, **extra: Any) -> Response:
    result = {"operation_id": request.app.state.next_operation_id(), "status": "completed"}
    return ok({**result, **extra}, request)


@router.put(
    _PREFIX, summary="Upsert points (list or batch form)", responses=documented(UpdateResult)
)
async def upsert_points(
    request: Request,
    body: UpsertBody,
    caller: Caller,
    collection: CollectionDep,
    wait: bool | None = None,
) -> Response:
    payloads: list[dict[str, Any] | None] | None
    if body.points is not None:
        ids = [p.id for p in body.points]
        rows, where = [p.vector for p in body.points], "points"
        payloads = [p.payload for p in body.points]
    else:
        assert body.batch is not None  # the model allows exactly one form
        batch = body.batch
        if len(batch.vectors) != len(batch.ids):
            raise ApiError(400, "batch: ids and vectors differ in length")
        if batch.payloads is not None and len(batch.payloads) != len(batch.ids):
            raise ApiError(400, "batch: ids and payloads differ in length")
        ids, rows, where, payloads = batch.ids, batch.vectors, "batch.vectors", batch.payloads
    dim = collection.config.dim
    if len(rows) * dim < _MATRIX_IN_THREAD_FLOATS:
        vectors = as_matrix(rows, dim, where)
    else:  # ~10 ms per 100k floats from lists: off the event loop
        vectors = await asyncio.to_thread(as_matrix, rows, dim, where)
    write = collection.upsert(
        list(ids), vectors, payloads, tenant=caller.tenant, max_points=caller.max_points
    )
    await shielded(write)
    return _updated(request)


def _point_id(text: str) -> int | str:
    return int(text) if text.isdigit() else text


@router.get(_PREFIX + "/{point_id}", summary="Retrieve one point", responses=documented(Record))
async def get_point(
    request: Request, point_id: str, caller: Caller, collection: CollectionDep
) -> Response:
    found = await collection.retrieve(
        [_point_id(point_id)], tenant=caller.tenant, with_payload=True, with_vector=True
    )
    if not found:  # the same answer for absent and unreadable: nothing leaks
        raise ApiError(404, f"No point with id {point_id} found")
    return ok(point_json(found[0], payload_selection(True)), request)


@router.post(_PREFIX, summary="Retrieve points by id", responses=documented(list[Record]))
async def retrieve_points(
    request: Request, body: RetrieveBody, caller: Caller, collection: CollectionDep
) -> Response:
    selection = payload_selection(body.with_payload)
    found = await collection.retrieve(
        list(body.ids),
        tenant=caller.tenant,
        with_payload=selection[0],
        with_vector=wants_vector(body.with_vector),
    )
    return ok([point_json(p, selection) for p in found], request)


@router.post(
    _PREFIX + "/scroll",
    summary="Page through points in id order",
    responses=documented(ScrollResult),
)
async def scroll_points(
    request: Request, body: ScrollBody, caller: Caller, collection: CollectionDep
) -> Response:
    if body.order_by is not None:
        raise ApiError(400, "order_by is not supported: pages are in point id order")
    selection = payload_selection(body.with_payload)
    points, next_offset = await collection.scroll(
        limit=10 if body.limit is None else body.limit,
        offset=body.offset,
        filter=as_filter(body.filter),
        tenant=caller.tenant,
        with_payload=selection[0],
        with_vector=wants_vector(body.with_vector),
    )
    page = [point_json(p, selection) for p in points]
    return ok({"points": page, "next_page_offset": next_offset}, request)


@router.post(
    _PREFIX + "/delete", summary="Delete points by id or filter", responses=documented(UpdateResult)
)
async def delete_points(
    request: Request,
    body: DeleteBody,
    caller: Caller,
    collection: CollectionDep,
    wait: bool | None = None,
) -> Response:
    if body.points is not None:
        await shielded(collection.delete(list(body.points), tenant=caller.tenant))
    else:
        where = as_filter(body.filter)
        assert where is not None  # the model requires one form
        await shielded(collection.delete_where(where, tenant=caller.tenant))
    return _updated(request)


@router.post(_PREFIX + "/count", summary="Count points", responses=documented(Count))
async def count_points(
    request: Request, body: CountBody, caller: Caller, collection: CollectionDep
) -> Response:
    count = await collection.count(as_filter(body.filter), tenant=caller.tenant)
    return ok({"count": count}, request)


_NUMBER_TYPES = {int, float}  # not bool: JSON's true is no coordinate


async def _query_vector(body: QueryBody, collection: Collection, caller: Principal) -> list[float]:
    query: Any = body.query
    if isinstance(query, dict):
        if set(query) != {"nearest"}:
            raise ApiError(400, 'query: give a vector, a point id or {"nearest": either}')
        query = query["nearest"]
    if query is None:
        raise ApiError(400, "query: a vector or a point id is required")
    if body.prefetch is not None or body.using:
        raise ApiError(400, "prefetch and named vectors (using) are not supported")
    if isinstance(query, int | str) and not isinstance(query, bool):  # a point's own vector
        found = await collection.retrieve(
            [query], tenant=caller.tenant, with_payload=False, with_vector=True
        )
        if not found or found[0].vector is None:  # absent and unreadable look the same
            raise ApiError(404, f"query: no point with id {query}")
        return [float(x) for x in found[0].vector]
    # one pass in C over the element types (a query is hundreds of floats, on every request)
    if not isinstance(query, list) or not set(map(type, query)) <= _NUMBER_TYPES:
        raise ApiError(400, "query: a vector of numbers or a point id is required")
    return query


async def search(
    collection: Collection, vector: list[float], body: QueryBody | SearchBody, caller: Principal
) -> list[dict[str, Any]]:
    """The hits of one checked vector as JSON-ready dicts (also ``server.fast_query``'s)."""
    selection = payload_selection(body.with_payload)
    params = body.params
    hits = await collection.query(
        as_matrix([vector], collection.config.dim, "query"),
        limit=10 if body.limit is None else body.limit,
        offset=body.offset or 0,
        filter=as_filter(body.filter),
        tenant=caller.tenant,
        with_payload=selection[0],
        with_vector=wants_vector(body.with_vector),
        score_threshold=body.score_threshold,
        exact=bool(params and params.exact),
    )
    return [hit_json(hit, selection) for hit in hits[0]]


@router.post(
    QUERY_PATH,
    summary="Query points nearest to a vector",
    responses=documented(QueryResult),
)
async def query_points(
    request: Request, body: QueryBody, caller: Caller, collection: CollectionDep
) -> Response:
    vector = await _query_vector(body, collection, caller)
    points = await search(collection, vector, body, caller)
    return ok({"points": points}, request)


@router.post(
    _PREFIX + "/query/batch", summary="Run several queries", responses=documented(list[QueryResult])
)
async def query_batch(
    request: Request, body: QueryBatchBody, caller: Caller, collection: CollectionDep
) -> Response:
    vectors = [await _query_vector(s, collection, caller) for s in body.searches]  # all or none
    runs = [search(collection, v, s, caller) for v, s in zip(vectors, body.searches, strict=True)]
    results = await asyncio.gather(*runs)  # concurrent: the index gathers them into one batch
    return ok([{"points": points} for points in results], request)


@router.post(
    _PREFIX + "/search",
    summary="Search (legacy alias of query)",
    responses=documented(list[ScoredPoint]),
)
async def search_points(
    request: Request, body: SearchBody, caller: Caller, collection: CollectionDep
) -> Response:
    return ok(await search(collection, body.vector, body, caller), request)


@router.post(
    _PREFIX + "/grant",
    summary="Grant points to a tenant (admin)",
    responses=documented(UpdateResult),
)
async def grant_points(
    request: Request, body: GrantBody, _: Admin, collection: CollectionDep
) -> Response:
    changed = await shielded(collection.grant(list(body.points), body.tenant))
    return _updated(request, changed=changed)


@router.post(
    _PREFIX + "/revoke",
    summary="Revoke points from a tenant (admin)",
    responses=documented(UpdateResult),
)
async def revoke_points(
    request: Request, body: GrantBody, _: Admin, collection: CollectionDep
) -> Response:
    changed = await shielded(collection.revoke(list(body.points), body.tenant))
    return _updated(request, changed=changed)
