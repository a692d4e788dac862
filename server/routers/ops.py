"""Operations: ``/`` (name and version, what qdrant-client checks), ``/healthz`` (the process
answers), ``/readyz`` (the catalog is open: 503 before and while stopping) and ``/metrics``
(Prometheus text). None of them needs a key or says anything about the data.

Thread-safety: handlers run on the event loop; blocking work goes to worker threads.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from server.envelope import OrjsonResponse, OrjsonRoute, ok
from server.errors import ApiError
from server.responses import RootInfo, documented

__all__ = ["QDRANT_VERSION", "router"]

router = APIRouter(tags=["ops"], route_class=OrjsonRoute)
# The Qdrant API version whose REST shapes this service follows: qdrant-client compares it
# with its own and warns when the minor versions differ by more than one.
QDRANT_VERSION = "1.20.0"


@router.get("/", summary="Service name and version", responses={200: {"model": RootInfo}})
async def root() -> Response:
    return OrjsonResponse({"title": "tierkit - vector search service", "version": QDRANT_VERSION})


@router.get("/healthz", summary="Liveness", responses=documented(dict[str, str]))
async def healthz(request: Request) -> Response:
    return ok({"status": "alive"}, request)


@router.get(
    "/readyz", summary="Readiness: the catalog is open", responses=documented(dict[str, str])
)
async def readyz(request: Request) -> Response:
    if getattr(request.app.state, "catalog", None) is None:
        raise ApiError(503, "not ready")
    return ok({"status": "ready"}, request)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
