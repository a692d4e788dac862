"""The dependencies every router shares: who is calling, the catalog, the collection.

    @router.post("/collections/{collection_name}/points/count")
    async def count(body: CountBody, caller: Caller, collection: CollectionDep): ...

``Caller`` authenticates the ``api-key`` header (or ``Authorization: Bearer``), applies the
tenant's rate limit (429 with Retry-After) and records the tenant for the access log. ``Admin``
is a Caller that must be the admin (403 otherwise). The state they read (``keys``, ``catalog``,
``limiter``) is set on ``app.state`` by the lifespan; before it is, requests get 503.

Thread-safety: event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request

from server.errors import ApiError, RateLimitedError
from server.keys import ForbiddenError, KeyStore, Principal
from server.ratelimit import RateLimiter
from vectordb.collections import Catalog, Collection

__all__ = ["Admin", "Caller", "CatalogDep", "CollectionDep", "drain_writes", "shielded"]

T = TypeVar("T")
_writes: set[asyncio.Future[Any]] = set()  # shielded writes still running (event loop only)

# The key is read from the headers here, not through FastAPI's security dependencies: each
# dependency costs every request; the OpenAPI document declares both schemes (server.app).


def _state(request: Request, name: str) -> Any:
    value = getattr(request.app.state, name, None)
    if value is None:
        raise ApiError(503, "service is starting or stopping")
    return value


def _presented_key(request: Request) -> str | None:
    """The ``api-key`` header, else the token of ``Authorization: Bearer``."""
    key = request.headers.get("api-key")
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def _caller(request: Request) -> Principal:
    keys: KeyStore = _state(request, "keys")
    principal = await keys.authenticate(_presented_key(request))
    request.state.tenant = principal.tenant or "admin"
    if principal.rps is not None:
        limiter: RateLimiter = _state(request, "limiter")
        wait_s = limiter.acquire(principal.tenant or "admin", principal.rps)
        if wait_s > 0:
            raise RateLimitedError(wait_s)
    return principal


async def _admin(caller: Annotated[Principal, Depends(_caller)]) -> Principal:
    if not caller.is_admin:
        raise ForbiddenError("this operation needs the admin key")
    return caller


async def _catalog(request: Request) -> Catalog:  # async: no thread hop per request
    catalog: Catalog = _state(request, "catalog")
    return catalog


async def _collection(collection_name: str, request: Request) -> Collection:
    catalog: Catalog = _state(request, "catalog")
    return catalog.get(collection_name)  # CollectionNotFoundError: 404


Caller = Annotated[Principal, Depends(_caller)]
Admin = Annotated[Principal, Depends(_admin)]
CatalogDep = Annotated[Catalog, Depends(_catalog)]
CollectionDep = Annotated[Collection, Depends(_collection)]


async def shielded(work: Awaitable[T]) -> T:
    """Await a write so that a request timeout or a dropped client does not cancel it half
    way: the write finishes (and is durable) even when its answer is lost. Shutdown waits for
    such writes (``drain_writes``) before it closes the catalog."""
    task = asyncio.ensure_future(work)
    _writes.add(task)
    task.add_done_callback(_writes.discard)
    return await asyncio.shield(task)


async def drain_writes(timeout_s: float) -> int:
    """Wait up to ``timeout_s`` for the shielded writes of this loop; how many were running."""
    loop = asyncio.get_running_loop()
    running = [t for t in _writes if t.get_loop() is loop and not t.done()]
    if running:
        await asyncio.wait(running, timeout=timeout_s)
    return len(running)
