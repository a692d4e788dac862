"""server.http_protocol: a response's header block and body leave in one write, bytes keep
their order, a header block with nothing after it still goes out on the loop's next turn, and
the service answers through it (a live server, keep-alive, several requests on a connection)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from server.http_protocol import OneWriteTransport
from tests.server.live_server import LiveServer

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Transport:
    """Records writes; the parts of asyncio.Transport the wrapper uses."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.protocol: Any = None

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _wrapped() -> tuple[OneWriteTransport, _Transport, asyncio.AbstractEventLoop]:
    loop = asyncio.get_running_loop()
    inner = _Transport()
    return OneWriteTransport(inner, loop), inner, loop  # type: ignore[arg-type]


async def _next_turns() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_header_and_body_go_out_in_one_write() -> None:
    async def run() -> None:
        outer, inner, _ = _wrapped()
        outer.write(HEAD)
        assert inner.writes == []  # held for the body
        outer.write(b"ok")
        assert inner.writes == [HEAD + b"ok"]
        outer.write(b"more")  # not a header block: straight through, in order
        assert inner.writes == [HEAD + b"ok", b"more"]
        await _next_turns()  # the held block's callback finds nothing left
        assert inner.writes == [HEAD + b"ok", b"more"]
        assert outer.get_extra_info("peername") == "info:peername"  # the rest is the transport's

    asyncio.run(run())


def test_a_lone_header_block_goes_out_on_the_next_turn() -> None:
    async def run() -> None:
        outer, inner, _ = _wrapped()
        outer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await _next_turns()
        assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        outer.write(HEAD)  # a second response on the connection is held again
        outer.write(b"ok")
        assert inner.writes[-1] == HEAD + b"ok"

    asyncio.run(run())


def test_close_eof_and_protocol_switch_write_what_is_held_abort_drops_it() -> None:
    async def run() -> None:
        outer, inner, _ = _wrapped()
        outer.write(HEAD)
        outer.close()
        assert inner.writes == [HEAD] and inner.closed
        outer, inner, _ = _wrapped()
        outer.write(HEAD)
        outer.write_eof()
        assert inner.writes == [HEAD, b"<eof>"]
        outer, inner, _ = _wrapped()
        outer.write(HEAD)
        outer.set_protocol("ws")  # type: ignore[arg-type]
        assert inner.writes == [HEAD] and inner.protocol == "ws"
        outer, inner, _ = _wrapped()
        outer.write(HEAD)
        outer.abort()
        await _next_turns()
        assert inner.writes == [] and inner.aborted

    asyncio.run(run())


def test_the_service_answers_through_it(tmp_path: Path) -> None:
    with LiveServer(tmp_path / "data") as server:
        headers = {"api-key": server.admin_key}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            body = {"vectors": {"size": 4, "distance": "Cosine"}}
            assert client.put("/collections/c", json=body).status_code == 200
            points = [{"id": i, "vector": [1.0, i, 0.5, 0.0]} for i in range(5)]
            put = client.put("/collections/c/points?wait=true", json={"points": points})
            assert put.status_code == 200
            for _ in range(3):  # one keep-alive connection: each answer whole and in order
                hits = client.post("/collections/c/points/query", json={"query": [1, 2, 0.5, 0]})
                assert hits.status_code == 200, hits.text
                assert hits.json()["result"]["points"][0]["id"] == 2
                assert client.get("/healthz").status_code == 200
                assert client.head("/healthz").status_code in (200, 405)
