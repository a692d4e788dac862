"""The application: ``create_app(settings)`` wires the routers, middleware and error handlers;
its lifespan opens the key store and the catalog, and closes them on shutdown.

    app = create_app(Settings(data_dir="data"))
    uvicorn.run(app)        # or server.run.serve(settings)

Start: the C allocator's big blocks mapped on their own (server.memory), the key store (a first
start with no admin key creates one and prints it once to stdout, ``admin key: tk_...``, unless
``$TIERKIT_ADMIN_KEY`` gives it), then the catalog (inside the running loop: its I/O engine binds
to it), then, with ``settings.sample``, the sample collection.
Stop: uvicorn first drains in-flight requests (``graceful_timeout_s``); then the catalog is taken
out of service (requests answer 503), writes still running are awaited (a timed-out request's
shielded write), and it is closed, which checkpoints every collection.

In front of everything, the query route's fast path (server.fast_query: plain vector queries
answered without the framework, with the same limits, metrics and log). Middleware, outermost
first: observability (request id, access log, metrics), body limit, timeout.
Thread-safety: one app per event loop.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from server.access_log import writer as access_writer
from server.deps import drain_writes
from server.envelope import OrjsonResponse, OrjsonRoute
from server.errors import install_error_handlers
from server.fast_query import FastQuery
from server.keys import KeyStore
from server.limits import BodyLimitMiddleware, TimeoutMiddleware
from server.memory import settle_allocator, trimming_heap
from server.metrics import Metrics
from server.observability import ObservabilityMiddleware
from server.ratelimit import RateLimiter
from server.routers import collections, keys, ops, points
from server.sample import ensure_sample
from server.settings import Settings
from vectordb.collections import Catalog

__all__ = ["create_app"]

log = logging.getLogger("tierkit.server")
DESCRIPTION = """A Qdrant-compatible REST vector search service over tierkit's disk-resident
index. Authenticate with the `api-key` header (or `Authorization: Bearer`): the admin key, or a
tenant key that sees only the points granted to its tenant."""


SECURITY_SCHEMES = {
    "ApiKey": {"type": "apiKey", "in": "header", "name": "api-key", "description": "tk_... key"},
    "Bearer": {"type": "http", "scheme": "bearer", "description": "the same key as a bearer token"},
}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document without its 422 answers (validation errors are 400 here), with the
    key's two security schemes on every route but the ops ones."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                if "ops" not in operation.get("tags", ()):  # health, metrics: no key
                    operation["security"] = [{name: []} for name in SECURITY_SCHEMES]
        app.openapi_schema = schema
    return app.openapi_schema


def _add_route(app: FastAPI, route: APIRoute) -> None:
    """``route`` on the app's own router. ``include_router`` would nest each router (FastAPI
    0.165 matches an included router's routes twice per request: ~0.1 ms of every request)."""
    app.router.add_api_route(
        route.path,
        route.endpoint,
        methods=sorted(route.methods or ()),
        summary=route.summary,
        description=route.description,
        tags=list(route.tags),
        responses=route.responses,
        response_class=route.response_class,
        name=route.name,
        route_class_override=OrjsonRoute,
    )


class _Service(FastAPI):
    """FastAPI with the query route's fast path in front of its middleware (server.fast_query:
    plain vector queries answered without the framework; the rest go through it)."""

    fast_query: FastQuery | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fast_query is not None and FastQuery.takes(scope):
            await self.fast_query(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settle_allocator()  # a batch's big scratch arrays: unmapped when freed (server.memory)
        admin_key = os.environ.get("TIERKIT_ADMIN_KEY") or None
        store, created = await asyncio.to_thread(KeyStore.open, settings.data_dir, admin_key)
        if created is not None:
            print(f"admin key: {created}", flush=True)
            print("  (shown once, stored only as a hash: keep it)", flush=True)
        catalog = await Catalog.open(
            settings.data_dir, memory_budget_bytes=settings.memory_budget_bytes
        )
        try:
            if settings.sample:
                await ensure_sample(catalog)
            app.state.keys = store
            app.state.limiter = RateLimiter()
            app.state.catalog = catalog
            log.info("ready: %d collection(s) in %s", len(catalog.names()), settings.data_dir)
            # freed heap pages back to the OS (server.memory)
            async with trimming_heap(settings.heap_trim_every_s):
                yield
        finally:
            app.state.catalog = None  # new requests: 503
            # uvicorn has drained the requests; a write whose request timed out may still run
            drained = await drain_writes(timeout_s=60.0)
            if drained:
                log.info("waited for %d write(s) to finish", drained)
            await catalog.aclose()
            await asyncio.to_thread(access_writer.flush)  # the last requests' lines

    app = _Service(
        title="tierkit",
        version=ops.QDRANT_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        default_response_class=OrjsonResponse,
    )
    app.state.settings = settings
    app.state.catalog = None
    app.state.keys = None
    app.state.next_operation_id = itertools.count(1).__next__
    app.state.metrics = Metrics(lambda: getattr(app.state, "catalog", None))
    app.state.route_methods = []  # for the Allow header of a 405 (server.errors)
    for module in (points, collections, keys, ops):  # hot routes first: matching is linear
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            _add_route(app, route)
            app.state.route_methods.append((route.path_regex, route.methods))
    install_error_handlers(app)
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    app.add_middleware(TimeoutMiddleware, timeout_s=settings.request_timeout_s)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(ObservabilityMiddleware, metrics=app.state.metrics)
    app.fast_query = FastQuery(app, functools.partial(FastAPI.__call__, app))
    return app
