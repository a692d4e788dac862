"""Pure ASGI middleware bounding each request: its body size and its duration.

``BodyLimitMiddleware`` refuses a body over ``max_body_bytes`` with 413: at once when
Content-Length says so, else as soon as the bytes received pass the limit (a chunked body is
never read whole). ``TimeoutMiddleware`` cancels a request still running after ``timeout_s`` and
answers 504 if nothing was sent yet; writes that must not be torn shield themselves
(``server.deps.shielded``), so a timed-out write may still complete.

Both answer in Qdrant's error envelope. Thread-safety: stateless per request; event loop only.
"""

from __future__ import annotations

import asyncio

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "BodyLimitMiddleware",
    "BodyTooLargeError",
    "TimeoutMiddleware",
    "header",
    "send_error",
]


class BodyTooLargeError(HTTPException):
    """Raised from ``receive``: FastAPI lets an HTTPException out of its body parsing as is."""

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__(413, f"request body larger than {max_body_bytes} bytes")


async def send_error(
    send: Send, status_code: int, message: str, headers: dict[str, str] | None = None
) -> None:
    body = orjson.dumps({"status": {"error": message}, "time": 0.0})
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status_code, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class _Tracked:
    """Wraps ``send`` to know whether the response has started."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await send_error(send, 400, "bad Content-Length header")
                    return
                if int(value) > limit:
                    await send_error(send, 413, str(BodyTooLargeError(limit).detail))
                    return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(limit)
            return message

        tracked = _Tracked(send)
        try:
            await self.app(scope, limited, tracked)
        except BodyTooLargeError as exc:  # raised where no handler turned it into a response
            if not tracked.started:
                await send_error(send, 413, str(exc.detail))


class TimeoutMiddleware:
    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = _Tracked(send)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.app(scope, receive, tracked)
        except TimeoutError:
            if not tracked.started:
                message = f"request timed out after {self.timeout_s:g} s"
                await send_error(send, 504, message)


def header(scope: Scope, name: bytes) -> str | None:
    """The first header ``name`` (lower-case bytes) of ``scope``, decoded as latin-1."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None
