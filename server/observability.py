"""The outermost middleware: a request id, the timing, one JSON log line and the metrics.

Each request gets ``X-Request-Id`` (the client's, if it sent a sane one, else a new random
version-4 uuid),
echoed in the response. When it ends, one line goes to the ``tierkit.server.access`` logger
(written by server.access_log's thread, off the event loop):

    {"request_id": "...", "method": "POST", "route": "/collections/{name}/points/query",
     "status": 200, "duration_ms": 2.1, "tenant": "acme"}

``tenant`` is what the auth dependency put in the request state ("admin" for the admin, null
before authentication); the key itself is never logged. ``started_s`` in the request state is
the start time the envelope's ``time`` counts from.

Thread-safety: stateless per request; event loop only.
"""

from __future__ import annotations

import logging
import random
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.access_log import access_log, writer
from server.limits import header
from server.metrics import Metrics

__all__ = ["ObservabilityMiddleware", "record", "request_id_of"]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# request ids need to be unique, not secret: drawn from a generator seeded once from the OS.
# uuid4() reads os.urandom on every request, and that call lets go of the GIL: under load the
# event loop then waits for a search thread to hand it back (up to the 5 ms switch interval).
_ids = random.Random()


def _new_request_id() -> str:
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))


class ObservabilityMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        state = scope.setdefault("state", {})
        state["started_s"] = started_s
        request_id = state["request_id"] = request_id_of(scope)
        status = 500

        async def tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            method = scope.get("method", "")
            duration_s = time.perf_counter() - started_s
            record(self.metrics, request_id, method, template, status, duration_s, state)


def request_id_of(scope: Scope) -> str:
    """The client's ``X-Request-Id`` when it is sane, else a new one."""
    given = header(scope, b"x-request-id")
    return given if given and _REQUEST_ID.match(given) else _new_request_id()


def record(
    metrics: Metrics,
    request_id: str,
    method: str,
    template: str,
    status: int,
    duration_s: float,
    state: dict[str, Any],
) -> None:
    """The metrics and the access log line of one answered request."""
    metrics.observe(template, method, status, duration_s)
    if access_log.isEnabledFor(logging.INFO):  # fields in server.access_log.FIELDS' order
        duration_ms = round(duration_s * 1000, 3)
        writer.put((request_id, method, template, status, duration_ms, state.get("tenant")))
