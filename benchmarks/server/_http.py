"""A small HTTP/1.1 client on raw asyncio streams: one keep-alive connection per caller.

The load generator must cost the loopback server as little CPU as it can (on 2 vCPUs they
share the cores), so there is no client library: a request is one ``write`` of pre-encoded
bytes, a response is its header block and a ``Content-Length`` (or chunked) body. A failed or
closed connection is reopened on the next request; the failure is the caller's error to count.
"""

from __future__ import annotations

import asyncio

import orjson

__all__ = ["HttpConn", "HttpError", "query_body"]

_MAX_HEADER_BYTES = 64 * 1024


class HttpError(RuntimeError):
    """A non-2xx answer: its status and the start of its body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


class HttpConn:
    """One keep-alive connection to ``host:port``; requests on it are sequential."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        lines = [f"Host: {host}:{port}", "Content-Type: application/json"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self._fixed = ("\r\n".join(lines) + "\r\n").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """(status, body) of one request; the connection is dropped on any failure."""
        try:
            reader, writer = await self._open()
            head = f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode()
            writer.write(head + self._fixed + b"\r\n" + body)
            status, keep, payload = await _read_response(reader)
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return status, payload

    async def call(self, method: str, path: str, body: bytes = b"") -> object:
        """The decoded JSON of a 2xx answer; HttpError otherwise."""
        status, payload = await self.request(method, path, body)
        if not 200 <= status < 300:
            raise HttpError(status, payload)
        return orjson.loads(payload) if payload else None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    block = await reader.readuntil(b"\r\n\r\n")
    if len(block) > _MAX_HEADER_BYTES:
        raise ConnectionError("response header block too large")
    lines = block.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ConnectionError(f"not an HTTP/1.x status line: {lines[0]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    if "content-length" in headers:
        return status, keep, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                return status, keep, b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    if status in (204, 304) or 100 <= status < 200:
        return status, keep, b""
    return status, False, await reader.read()  # body ends with the connection


def query_body(vector: list[float], limit: int = 10) -> bytes:
    """A ``POST /points/query`` body for one vector, no payload back."""
    return orjson.dumps({"query": vector, "limit": limit, "with_payload": False})
