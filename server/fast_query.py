"""The hot route without the framework: ``POST /collections/{name}/points/query`` with a plain
vector body, answered by pure ASGI before any middleware; every other request, and any query
this path does not take whole, goes to FastAPI's stack unchanged.

Why: under concurrent single-vector queries the server's event loop, which also drives the
index, spent most of its time in the framework rather than the search (py-spy of the GIL
holder at concurrency 64 on debian-minilm: ~58% of the samples under uvicorn's request cycle,
13% in the handler; the middleware layers, routing, request objects, dependency solving and
pydantic validation of a 384-float body took the rest). Here the same steps are direct: the
body parsed once by orjson, its shape checked by type, the key authenticated by the same
``KeyStore``, the same search (``routers.points.search``), the same envelope, the same
request id header, metrics and access log line (``server.observability.record``), the same
body limit and timeout (504 in the same envelope).

Taken whole: a JSON object with only ``query`` (a non-empty list of JSON numbers), ``limit``
(an integer 0..10,000), ``with_payload`` and ``with_vector`` (booleans), within the body
limit, from a key without a rate limit, on a collection that exists. Anything else (a point id
as query, a filter, a malformed or too large body, a missing or wrong key, a rate-limited
tenant, an unknown collection, a wrong dimension or any error while answering) goes to
FastAPI's stack with the body replayed, which answers it as it always has; a query reads and
changes nothing, so running it again there is safe.

Thread-safety: event loop only; ``answered`` counts the queries this path answered.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.envelope import RESPONSE_OPTIONS
from server.limits import send_error
from server.models import QueryBody
from server.observability import record, request_id_of
from server.routers.points import QUERY_PATH, search

__all__ = ["FastQuery"]

_PATH = re.compile(r"/collections/([^/]+)/points/query")
_KEYS = frozenset({"query", "limit", "with_payload", "with_vector"})
_NUMBERS = frozenset({int, float})  # not bool: JSON's true is no coordinate
_FLAGS = (True, False, None)
_HEADERS = [(b"content-type", b"application/json")]


def _presented_key(scope: Scope) -> str | None:
    """The ``api-key`` header, else a bearer token (as ``server.deps`` reads them)."""
    bearer = None
    for name, value in scope["headers"]:
        if name == b"api-key" and value:
            return str(value.decode("latin-1"))
        if name == b"authorization" and bearer is None:
            scheme, _, token = value.decode("latin-1").partition(" ")
            bearer = token.strip() or None if scheme.lower() == "bearer" else None
    return bearer


def _plain_query(doc: Any) -> tuple[list[float], QueryBody] | None:
    """The vector and the body as a QueryBody when it is one this path answers whole."""
    if type(doc) is not dict or not doc.keys() <= _KEYS:
        return None
    query, limit = doc.get("query"), doc.get("limit", 10)
    if type(query) is not list or not query or not set(map(type, query)) <= _NUMBERS:
        return None
    if type(limit) is not int or not 0 <= limit <= 10_000:
        return None
    with_payload, with_vector = doc.get("with_payload"), doc.get("with_vector")
    if with_payload not in _FLAGS or with_vector not in _FLAGS:
        return None
    if type(with_payload) is int or type(with_vector) is int:  # 0 and 1 compare equal
        return None
    body = QueryBody.model_construct(
        query=query, limit=limit, with_payload=with_payload, with_vector=with_vector
    )
    return query, body


class FastQuery:
    """``takes(scope)``: the request is this path's to try; ``await fast(scope, receive,
    send)`` answers it, or hands it to ``fallback`` (FastAPI's stack)."""

    def __init__(self, service: FastAPI, fallback: ASGIApp) -> None:
        self.service, self.fallback = service, fallback
        settings = service.state.settings
        self.max_body_bytes: int = settings.max_body_bytes
        self.timeout_s: float = settings.request_timeout_s
        self.answered = 0

    @staticmethod
    def takes(scope: Scope) -> bool:
        return (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and _PATH.fullmatch(scope["path"]) is not None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started_s = time.perf_counter()
        messages: list[Message] = []
        body = b""
        while len(body) <= self.max_body_bytes:  # past the limit, FastAPI's stack says 413
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        matched = _PATH.fullmatch(scope["path"])
        state = scope.setdefault("state", {})
        state["started_s"] = started_s
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = None
                if len(body) <= self.max_body_bytes and matched is not None:
                    answer = await self._answer(scope, matched.group(1), body, state)
        except TimeoutError:
            message_text = f"request timed out after {self.timeout_s:g} s"
            await self._finish(scope, send, 504, None, started_s, state, message_text)
            return
        if answer is None:
            await self.fallback(scope, _replay(messages, receive), send)
            return
        self.answered += 1
        await self._finish(scope, send, 200, answer, started_s, state)

    async def _finish(
        self,
        scope: Scope,
        send: Send,
        status: int,
        answer: bytes | None,
        started_s: float,
        state: dict[str, Any],
        error: str = "",
    ) -> None:
        request_id = request_id_of(scope)
        if answer is None:
            await send_error(send, status, error, {"x-request-id": request_id})
        else:
            headers = [*_HEADERS, (b"content-length", str(len(answer)).encode())]
            headers.append((b"x-request-id", request_id.encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        duration_s = time.perf_counter() - started_s
        metrics = self.service.state.metrics
        record(metrics, request_id, "POST", QUERY_PATH, status, duration_s, state)

    async def _answer(
        self, scope: Scope, name: str, body: bytes, state: dict[str, Any]
    ) -> bytes | None:
        """The response body, or None: FastAPI answers instead."""
        try:
            plain = _plain_query(orjson.loads(body))
        except orjson.JSONDecodeError:
            return None
        service = self.service.state
        keys, catalog = getattr(service, "keys", None), getattr(service, "catalog", None)
        if plain is None or keys is None or catalog is None:
            return None
        vector, query = plain
        try:
            caller = await keys.authenticate(_presented_key(scope))
            if caller.rps is not None:
                return None  # rate limits are counted once, on FastAPI's path
            points = await search(catalog.get(name), vector, query, caller)
        except Exception:
            return None
        state["tenant"] = caller.tenant or "admin"
        envelope = {
            "result": {"points": points},
            "status": "ok",
            "time": time.perf_counter() - state["started_s"],
        }
        return orjson.dumps(envelope, option=RESPONSE_OPTIONS)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` again first."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
