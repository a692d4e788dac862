"""uvicorn's httptools protocol with each response's header block and body sent in one write.

uvicorn writes a response's status line and headers when the app sends
``http.response.start``, and the body when it sends ``http.response.body``: two ``send``
calls on the socket, two TCP segments on loopback, and a client that wakes for the header
block and again for the body. Here the connection's transport is wrapped: a write that is a
header block (starts with ``HTTP/1.1 ``, nothing held before it) is held, and the next write
goes out joined to it, in one ``send``. A held block that no write follows in the same turn
of the loop (a streaming response between chunks, a ``100 Continue``) is written by a
callback on the loop's next turn, so nothing waits longer than that; ``close``,
``write_eof`` and a protocol switch write what is held first, ``abort`` drops it as it drops
the transport's own buffer. Bytes go out in the order they were written, always.

    uvicorn.Config(app, http=OneWriteHttpToolsProtocol, ...)

Thread-safety: event loop only, like the transport it wraps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["OneWriteHttpToolsProtocol", "OneWriteTransport"]

_HEADER_START = b"HTTP/1.1 "


class OneWriteTransport:
    """``transport`` with a response's header block held until the write after it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self.writes = 0  # writes passed to the transport (tests)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            if bytes(data[: len(_HEADER_START)]) == _HEADER_START:
                self._held = bytes(data)
                self._loop.call_soon(self._flush)
                return
            self._send(data)
            return
        self._held = None
        self._send(held + data)

    def _send(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1
        self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._send(held)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._flush()
        self._transport.set_protocol(protocol)

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's
        return getattr(self._transport, name)


class OneWriteHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's protocol; its request cycles write through a ``OneWriteTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # the flow control keeps the real transport (reading and writing pauses are its own)
        self.transport = OneWriteTransport(transport, self.loop)  # type: ignore[assignment]
