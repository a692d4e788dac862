"""The outermost middleware: a request id, the timing, one JSON log line and the metrics.

Each request gets ``X-Request-Id`` (the client's, if it sent a sane one, else a new uuid4),
echoed in the response. When it ends, one line goes to the ``tierkit.server.access`` logger:

    {"request_id": "...", "method": "POST", "route": "/collections/{name}/points/query",
     "status": 200, "duration_ms": 2.1, "tenant": "acme"}

``tenant`` is what the auth dependency put in the request state ("admin" for the admin, null
before authentication); the key itself is never logged. ``started_s`` in the request state is
the start time the envelope's ``time`` counts from.

Thread-safety: stateless per request; event loop only.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.limits import header
from server.metrics import Metrics

__all__ = ["ObservabilityMiddleware"]

access_log = logging.getLogger("tierkit.server.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


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
        given = header(scope, b"x-request-id")
        request_id = given if given and _REQUEST_ID.match(given) else str(uuid.uuid4())
        state["request_id"] = request_id
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
            duration_s = time.perf_counter() - started_s
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            method = scope.get("method", "")
            self.metrics.observe(template, method, status, duration_s)
            if access_log.isEnabledFor(logging.INFO):
                line = {
                    "request_id": request_id,
                    "method": method,
                    "route": template,
                    "status": status,
                    "duration_ms": round(duration_s * 1000, 3),
                    "tenant": state.get("tenant"),
                }
                access_log.info(json.dumps(line))
