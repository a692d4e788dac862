"""Every error becomes one Qdrant-shaped answer here, and only here (the app's one boundary).

    {"status": {"error": "Collection `docs` not found"}, "time": 0.0001}

Bad input is 400 (pydantic's validation and malformed JSON included, with the failing field),
an unknown key 401, a revoked key, a tenant on an admin route, a point the tenant may not change
or a quota 403, an unknown collection 404, a taken name 409, a rate limit 429 with Retry-After,
a timeout 504. Anything unexpected is 500 with no detail (logged with its traceback). Messages
never echo a key: the keys module never puts one in an exception, and validation messages
name fields of the body, not headers.

Thread-safety: handlers are stateless.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from server.envelope import error_response
from server.keys import ForbiddenError, UnauthorizedError
from tiers.io import InvalidArgumentError
from vectordb.collections import (
    CollectionExistsError,
    CollectionNotFoundError,
    PointNotWritableError,
    QuotaExceededError,
)

__all__ = ["ApiError", "RateLimitedError", "RequestTimeoutError", "install_error_handlers"]

log = logging.getLogger("tierkit.server")


class ApiError(Exception):
    """A refusal a handler or dependency decides itself: ``status_code`` and a message."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class RateLimitedError(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limit exceeded: retry in {retry_after_s:.2f} s")
        self.retry_after_s = retry_after_s


class RequestTimeoutError(Exception):
    """The request ran past ``request_timeout_s``."""


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "")
            message = f"malformed JSON: {detail}".rstrip(": ")
            where = "body"
        parts.append(f"{where}: {message}")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (``app.state.route_methods``: pairs of a
    path regex and its methods, set by create_app)."""
    methods: set[str] = set()
    for path_regex, route_methods in getattr(request.app.state, "route_methods", ()):
        if path_regex.match(request.url.path):
            methods |= set(route_methods)
    return ", ".join(sorted(methods))


def _status_of(exc: Exception) -> int:
    if isinstance(exc, CollectionExistsError):
        return 409
    if isinstance(exc, CollectionNotFoundError):
        return 404
    if isinstance(exc, InvalidArgumentError):
        return 400
    if isinstance(exc, PointNotWritableError | QuotaExceededError | ForbiddenError):
        return 403
    if isinstance(exc, UnauthorizedError):
        return 401
    return 500


async def _handle(request: Request, exc: Exception) -> Response:
    if isinstance(exc, RequestValidationError):
        return error_response(400, _validation_message(exc), request)
    if isinstance(exc, HTTPException):
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:  # Starlette names only the first route's methods
            headers = {**(headers or {}), "Allow": _allowed_methods(request)}
        return error_response(exc.status_code, str(exc.detail), request, headers)
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, str(exc), request)
    if isinstance(exc, RateLimitedError):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return error_response(429, str(exc), request, {"Retry-After": retry})
    if isinstance(exc, RequestTimeoutError):
        return error_response(504, str(exc), request)
    status = _status_of(exc)
    if status == 500:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal error", request)
    return error_response(status, str(exc), request)


def install_error_handlers(app: FastAPI) -> None:
    handled: list[Any] = [
        RequestValidationError,
        HTTPException,
        ApiError,
        RateLimitedError,
        RequestTimeoutError,
        InvalidArgumentError,
        CollectionNotFoundError,
        PointNotWritableError,
        QuotaExceededError,
        UnauthorizedError,
        ForbiddenError,
        Exception,
    ]
    for kind in handled:
        app.add_exception_handler(kind, _handle)
