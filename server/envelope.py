"""JSON on the wire, both ways with orjson (float vectors are most of the bytes), and Qdrant's
response envelope.

    return ok(result, request)    # {"result": result, "status": "ok", "time": seconds}
    error_response(404, "Collection `x` not found", request)
                                  # {"status": {"error": "..."}, "time": seconds}

``OrjsonRoute`` makes FastAPI parse request bodies with orjson: several times faster than the
standard library on big upserts, and it refuses ``NaN``/``Infinity``, which are not JSON (the
standard library lets them in). Its JSONDecodeError is the standard one, so a malformed body is
FastAPI's usual validation error (a 400 here).

``time`` is the seconds since the request started (``request.state.started_s``, set by the
observability middleware; 0.0 without it). numpy arrays and scalars serialise natively.

Thread-safety: pure functions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response

__all__ = ["RESPONSE_OPTIONS", "OrjsonResponse", "OrjsonRoute", "elapsed_s", "error_response", "ok"]

RESPONSE_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_PARSE_IN_THREAD_BYTES = 1 << 20


class OrjsonResponse(JSONResponse):
    """A JSON response rendered by orjson (NaN/inf become null, as orjson writes them)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=RESPONSE_OPTIONS)


def elapsed_s(request: Request | None) -> float:
    started_s = getattr(request.state, "started_s", None) if request is not None else None
    return 0.0 if started_s is None else time.perf_counter() - started_s


def ok(result: Any, request: Request | None = None) -> OrjsonResponse:
    return OrjsonResponse({"result": result, "status": "ok", "time": elapsed_s(request)})


def error_response(
    status_code: int,
    message: str,
    request: Request | None = None,
    headers: dict[str, str] | None = None,
) -> OrjsonResponse:
    body = {"status": {"error": message}, "time": elapsed_s(request)}
    return OrjsonResponse(body, status_code=status_code, headers=headers)


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) < _PARSE_IN_THREAD_BYTES:
                self._json = orjson.loads(body)
            else:  # ~50 ms per 10 MB: the loop keeps serving queries meanwhile
                self._json = await asyncio.to_thread(orjson.loads, body)
        return self._json


class OrjsonRoute(APIRoute):
    """An APIRoute whose handlers see request bodies parsed by orjson."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return orjson_handler
