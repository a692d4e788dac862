"""Bad input over real HTTP: every refusal is a 4xx with a message in Qdrant's error envelope,
never a 5xx and never a partial write. The server runs as ``python -m server`` with a small
body limit."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.live_server import LiveServer, new_admin_key

DIM = 4
MAX_BODY_BYTES = 100_000
C = "/collections/bad"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("bad-input") / "data"
    live = LiveServer(data, new_admin_key(), extra_args=["--max-body-bytes", str(MAX_BODY_BYTES)])
    live.start()
    try:
        created = live.admin("PUT", C, {"vectors": {"size": DIM, "distance": "Cosine"}})
        assert created.status_code == 200, created.text
        upsert = {"points": [{"id": 1, "vector": [1.0, 0.0, 0.0, 0.0], "payload": {"a": "x"}}]}
        assert live.admin("PUT", C + "/points", upsert).status_code == 200
        yield live
    finally:
        live.stop()


def refused(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    message = body["status"]["error"]
    assert isinstance(message, str) and message, body
    assert "Traceback" not in response.text
    return message


def raw(server: LiveServer, method: str, path: str, content: bytes, **headers: str) -> Any:
    headers = {"api-key": server.admin_key, "content-type": "application/json", **headers}
    return httpx.request(method, server.url + path, content=content, headers=headers, timeout=30)


def count(server: LiveServer) -> int:
    return int(server.admin("POST", C + "/points/count", {}).json()["result"]["count"])


@pytest.mark.parametrize(
    "body",
    [
        {"vectors": {"size": 0, "distance": "Cosine"}},
        {"vectors": {"size": "4", "distance": "Cosine"}},
        {"vectors": {"size": 4, "distance": "Manhattan"}},
        {"vectors": {"size": 4, "distance": "Cosine", "datatype": "uint8"}},
        {"vectors": {"size": 10**9, "distance": "Cosine"}},
        {"vectors": [4, "Cosine"]},
        {},
    ],
)
def test_bad_collection_configs(server: LiveServer, body: Any) -> None:
    refused(server.admin("PUT", "/collections/newone", body))
    assert server.admin("GET", "/collections/newone/exists").json()["result"]["exists"] is False


def test_bad_names_and_existing_collection(server: LiveServer) -> None:
    good = {"vectors": {"size": DIM, "distance": "Dot"}}
    refused(server.admin("PUT", "/collections/" + "a" * 300, good))
    refused(server.admin("PUT", "/collections/bad%20name", good))
    assert "exist" in refused(server.admin("PUT", C, good), 409)


@pytest.mark.parametrize(
    "points",
    [
        [{"id": 2, "vector": [1.0, 2.0, 3.0]}],  # wrong dimension
        [{"id": 2, "vector": [1.0, 2.0, 3.0, 4.0, 5.0]}],
        [{"id": 2, "vector": [1e39, 0.0, 0.0, 0.0]}],  # inf as float32
        [{"id": -1, "vector": [1.0, 2.0, 3.0, 4.0]}],
        [{"id": 2**63, "vector": [1.0, 2.0, 3.0, 4.0]}],
        [{"id": "not-a-uuid", "vector": [1.0, 2.0, 3.0, 4.0]}],
        [{"id": 1.5, "vector": [1.0, 2.0, 3.0, 4.0]}],
        [{"id": True, "vector": [1.0, 2.0, 3.0, 4.0]}],
        [{"id": 2, "vector": ["a", "b", "c", "d"]}],
        [{"id": 2, "vector": [1.0, 2.0, 3.0, 4.0], "payload": [1, 2]}],
        [{"id": 2}],
        [{"id": 2, "vector": [1.0, 2.0, 3.0, 4.0]}, {"id": 3, "vector": [1.0]}],
        [{"id": 2, "vector": [1.0, 2.0, 3.0, 4.0]}, {"id": 2, "vector": [1.0, 2.0, 3.0, 4.0]}],
        "points",
    ],
)
def test_bad_points_change_nothing(server: LiveServer, points: Any) -> None:
    before = count(server)
    refused(server.admin("PUT", C + "/points", {"points": points}))
    assert count(server) == before


def test_bad_batches(server: LiveServer) -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    for body in [
        {"batch": {"ids": [5, 6], "vectors": [v]}},
        {"batch": {"ids": [5], "vectors": [v], "payloads": [{}, {}]}},
        {"batch": {"ids": [5], "vectors": [v]}, "points": [{"id": 5, "vector": v}]},
        {},
    ]:
        refused(server.admin("PUT", C + "/points", body))


@pytest.mark.parametrize(
    "content",
    [
        b'{"points": [{"id": 7, "vector": [NaN, 1, 2, 3]}]}',
        b'{"points": [{"id": 7, "vector": [Infinity, 1, 2, 3]}]}',
        b'{"points": [',
        b"not json at all",
        b"\xff\xfe\x00",
        b"[]",
        b"null",
    ],
)
def test_malformed_and_non_json_bodies(server: LiveServer, content: bytes) -> None:
    before = count(server)
    refused(raw(server, "PUT", C + "/points", content))
    assert count(server) == before


def test_body_too_large_is_413(server: LiveServer) -> None:
    vector = [0.123456789] * DIM
    points = [{"id": i, "vector": vector} for i in range(10, 5000)]
    big = httpx.Request("PUT", "/", json={"points": points}).content
    assert len(big) > MAX_BODY_BYTES
    assert "larger than" in refused(raw(server, "PUT", C + "/points", big), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts bytes as they come
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    headers = {"api-key": server.admin_key, "content-type": "application/json"}
    response = httpx.put(server.url + C + "/points", content=chunks(), headers=headers)
    refused(response, 413)
    assert count(server) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"query": [1.0, 2.0]},
        {"query": None},
        {},
        {"query": "text"},
        {"query": {"nearest": "x"}},
        {"query": [1.0, 2.0, 3.0, 4.0], "limit": -1},
        {"query": [1.0, 2.0, 3.0, 4.0], "limit": "ten"},
        {"query": [1.0, 2.0, 3.0, 4.0], "filter": {"must": [{"key": "a", "match": {}}]}},
        {"query": [1.0, 2.0, 3.0, 4.0], "filter": {"bogus": 1}},
        {"query": [1.0, 2.0, 3.0, 4.0], "filter": {"must": "a"}},
        {"query": [1.0, 2.0, 3.0, 4.0], "filter": {"must": [{"key": "a", "range": {"gt": "x"}}]}},
        {"query": [1.0, 2.0, 3.0, 4.0], "with_payload": {"bogus": ["a"]}},
        {"query": [1.0, 2.0, 3.0, 4.0], "prefetch": [{"query": [1.0]}]},
    ],
)
def test_bad_queries(server: LiveServer, body: Any) -> None:
    refused(server.admin("POST", C + "/points/query", body))


def test_bad_reads_deletes_and_indexes(server: LiveServer) -> None:
    refused(server.admin("POST", C + "/points", {"ids": [{"x": 1}]}))
    refused(server.admin("POST", C + "/points", {"ids": "1"}))
    refused(server.admin("POST", C + "/points/delete", {}))
    refused(server.admin("POST", C + "/points/delete", {"points": [1], "filter": {}}))
    refused(server.admin("POST", C + "/points/count", {"filter": {"should": 5}}))
    refused(server.admin("PUT", C + "/index", {"field_name": "a", "field_schema": "integer"}))
    refused(server.admin("PUT", C + "/index", {"field_schema": "keyword"}))
    refused(server.admin("PUT", C + "/points?wait=maybe", {"points": []}))
    assert server.admin("GET", C + "/points/not-a-uuid").status_code in (400, 404)
    refused(server.admin("GET", C + "/points/12345"), 404)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/collections/nope", None),
        ("DELETE", "/collections/nope", None),
        ("PUT", "/collections/nope/points", {"points": [{"id": 1, "vector": [1.0]}]}),
        ("POST", "/collections/nope/points", {"ids": [1]}),
        ("GET", "/collections/nope/points/1", None),
        ("POST", "/collections/nope/points/query", {"query": [1.0]}),
        ("POST", "/collections/nope/points/count", {}),
        ("POST", "/collections/nope/points/delete", {"points": [1]}),
        ("PUT", "/collections/nope/index", {"field_name": "a", "field_schema": "keyword"}),
    ],
)
def test_unknown_collection_is_404(server: LiveServer, method: str, path: str, body: Any) -> None:
    response = server.admin(method, path, body)
    if method == "DELETE":  # Qdrant's answer: nothing was deleted
        assert response.status_code == 200 and response.json()["result"] is False
    else:
        assert "not found" in refused(response, 404)


def test_random_junk_never_5xx(server: LiveServer) -> None:
    rng = random.Random(7)
    junk: list[Any] = [None, 0, -1, 1.5, "", "x", [], {}, [1, "a"], {"a": None}, True, 2**70]
    paths = [
        ("PUT", C),
        ("PUT", C + "/points"),
        ("POST", C + "/points"),
        ("POST", C + "/points/query"),
        ("POST", C + "/points/query/batch"),
        ("POST", C + "/points/search"),
        ("POST", C + "/points/count"),
        ("POST", C + "/points/delete"),
        ("PUT", C + "/index"),
        ("POST", "/admin/keys"),
    ]
    fields = ["points", "batch", "ids", "query", "vector", "filter", "limit", "searches", "tenant"]
    with httpx.Client(base_url=server.url, headers={"api-key": server.admin_key}) as http:
        for _ in range(300):
            method, path = rng.choice(paths)
            body = {rng.choice(fields): rng.choice(junk) for _ in range(rng.randint(0, 3))}
            response = http.request(method, path, json=body)
            assert response.status_code < 500, (method, path, body, response.text[:300])
            if response.status_code >= 400:
                assert response.json()["status"]["error"]
    assert count(server) == 1
