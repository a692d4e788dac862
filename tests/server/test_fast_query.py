"""The query route's fast path (server.fast_query): a plain vector query is answered without the
framework, with the same answer, request id, metrics, tenant scoping, body limit and timeout;
everything else is answered by FastAPI's stack as before. In-process (httpx over ASGI): the
app's own ``__call__`` is what uvicorn calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.server.asgi_app import asgi_service

ADMIN = "tk_00000000a11e_" + "f" * 32
DIM = 8
QUERY = "/collections/c/points/query"


@contextlib.asynccontextmanager
async def service(data: Path, **settings: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    async with asgi_service(data, ADMIN, log_level="warning", **settings) as (http, app):
        yield http, app


async def _fill(http: httpx.AsyncClient, n: int = 200) -> np.ndarray:
    vectors = np.random.default_rng(3).standard_normal((n, DIM)).astype(np.float32)
    made = await http.put("/collections/c", json={"vectors": {"size": DIM, "distance": "Dot"}})
    assert made.status_code == 200, made.text
    batch = {
        "ids": list(range(n)),
        "vectors": vectors.tolist(),
        "payloads": [{"n": i} for i in range(n)],
    }
    done = await http.put("/collections/c/points?wait=true", json={"batch": batch})
    assert done.status_code == 200, done.text
    return vectors


def test_plain_queries_answer_as_the_framework_does(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with service(tmp_path / "data") as (http, app):
            vectors = await _fill(http)
            for row in (0, 17, 101):
                query: dict[str, Any] = {"query": vectors[row].tolist(), "limit": 5}
                for extra in ({}, {"with_payload": True}, {"with_vector": True}):
                    before = app.fast_query.answered
                    fast = await http.post(QUERY, json={**query, **extra})
                    assert app.fast_query.answered == before + 1
                    # "filter": null is a key the fast path leaves to FastAPI
                    slow = await http.post(QUERY, json={**query, **extra, "filter": None})
                    assert app.fast_query.answered == before + 1
                    assert fast.status_code == slow.status_code == 200
                    assert fast.json()["result"] == slow.json()["result"]
                    assert fast.json()["result"]["points"][0]["id"] == row
                    assert set(fast.json()) == {"result", "status", "time"}
            marked = await http.post(QUERY, json=query, headers={"x-request-id": "fast-1"})
            assert marked.headers["x-request-id"] == "fast-1"
            metrics = (await http.get("/metrics")).text
            route = 'route="/collections/{collection_name}/points/query"'
            assert any(route in x and 'status="200"' in x for x in metrics.splitlines())

    asyncio.run(scenario())


def test_everything_else_is_the_framework_s(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with service(tmp_path / "data") as (http, app):
            vectors = await _fill(http)
            vector = vectors[5].tolist()
            cases = [
                ({"query": vector}, {"api-key": "tk_wrong"}, QUERY, 401),
                ({"query": vector}, {}, "/collections/nope/points/query", 404),
                ({"query": vector[:-1]}, {}, QUERY, 400),
                ({"query": vector, "limit": "ten"}, {}, QUERY, 400),
                ({"query": vector, "limit": True}, {}, QUERY, 400),
                ({"query": [True] * DIM}, {}, QUERY, 400),
                ({"query": 5}, {}, QUERY, 200),  # a point's own vector
            ]
            for body, headers, path, status in cases:
                answer = await http.post(path, json=body, headers=headers)
                assert answer.status_code == status, (body, answer.text)
                assert "result" in answer.json() or "error" in answer.json()["status"]
            bad = await http.post(QUERY, content=b"{not json", headers={"api-key": ADMIN})
            assert bad.status_code == 400
            assert app.fast_query.answered == 0

    asyncio.run(scenario())


def test_tenants_limits_and_timeouts_hold(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with service(tmp_path / "data", max_body_bytes=65536) as (http, app):
            vectors = await _fill(http)
            made = await http.post("/admin/keys", json={"tenant": "acme"})
            key = made.json()["result"]["key"]
            granted = await http.post(
                "/collections/c/points/grant", json={"tenant": "acme", "points": [3, 4]}
            )
            assert granted.status_code == 200, granted.text
            found = await http.post(
                QUERY, json={"query": vectors[9].tolist(), "limit": 10}, headers={"api-key": key}
            )
            assert found.status_code == 200 and app.fast_query.answered == 1
            assert sorted(p["id"] for p in found.json()["result"]["points"]) == [3, 4]
            # a rate-limited key is counted once, by the framework's path
            limited = (await http.post("/admin/keys", json={"tenant": "slow", "rps": 1.0})).json()
            answers = [
                await http.post(
                    QUERY,
                    json={"query": vectors[0].tolist()},
                    headers={"api-key": limited["result"]["key"]},
                )
                for _ in range(3)
            ]
            assert [a.status_code for a in answers].count(429) >= 1
            assert app.fast_query.answered == 1
            too_big = await http.post(QUERY, json={"query": [0.5] * 20_000})
            assert too_big.status_code == 413
        async with service(tmp_path / "data", request_timeout_s=1e-6) as (http, app):
            late = await http.post(QUERY, json={"query": vectors[0].tolist()})
            assert late.status_code == 504 and "timed out" in late.json()["status"]["error"]

    asyncio.run(scenario())
