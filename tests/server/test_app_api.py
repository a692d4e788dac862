"""The API's shapes over real HTTP: every answer parses with qdrant-client 1.20's own models,
both upsert forms and every read path agree, and tenant keys see only their points (grants,
revokes, quotas, writes to others' points refused). Tests run in file order on one server."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from qdrant_client.http import models as qm

from tests.server.live_server import LiveServer, result

DIM = 8
C = "/collections/api"
RNG = np.random.default_rng(3)
VECTORS = RNG.standard_normal((40, DIM)).astype(np.float32)
UUID = str(uuid.UUID(int=12345))


def vec(i: int) -> list[float]:
    return [float(x) for x in VECTORS[i]]


def tenant_key(live: LiveServer, tenant: str, **quota: Any) -> str:
    made = result(live.admin("POST", "/admin/keys", {"tenant": tenant, **quota}))
    assert made["key"].startswith("tk_") and made["tenant"] == tenant
    return str(made["key"])


def test_root_and_docs_need_no_key(live: LiveServer) -> None:
    root = httpx.get(live.url + "/").json()
    assert root["version"].startswith("1.")
    assert httpx.get(live.url + "/docs").status_code == 200
    spec = httpx.get(live.url + "/openapi.json").json()
    assert "/collections/{collection_name}/points/query" in spec["paths"]
    query = spec["paths"]["/collections/{collection_name}/points/query"]["post"]
    assert "requestBody" in query
    assert {"QueryBody", "UpsertBody", "CreateCollectionBody"} <= set(spec["components"]["schemas"])
    # validation errors are 400 here, documented with every other refusal; no 422
    assert set(query["responses"]) >= {"200", "400", "401", "403", "404", "413", "429"}
    assert "422" not in query["responses"]
    allow = httpx.request("PATCH", live.url + C, headers={"api-key": live.admin_key})
    assert allow.status_code == 405
    assert set(allow.headers["allow"].split(", ")) == {"GET", "PUT", "DELETE"}


def test_create_and_describe(live: LiveServer) -> None:
    body = {"vectors": {"size": DIM, "distance": "Cosine"}, "hnsw_config": {"m": 16}}
    assert result(live.admin("PUT", C, body)) is True
    assert result(live.admin("GET", C + "/exists")) == {"exists": True}
    listed = qm.CollectionsResponse.model_validate(result(live.admin("GET", "/collections")))
    assert "api" in [c.name for c in listed.collections]
    info = qm.CollectionInfo.model_validate(result(live.admin("GET", C)))
    assert isinstance(info.config.params.vectors, qm.VectorParams)
    assert info.config.params.vectors.size == DIM
    assert info.config.params.vectors.distance == qm.Distance.COSINE
    assert info.points_count == 0


def test_upsert_both_forms_and_read_back(live: LiveServer) -> None:
    points = [{"id": i, "vector": vec(i), "payload": {"g": f"g{i % 3}", "i": i}} for i in range(20)]
    done = qm.UpdateResult.model_validate(
        result(live.admin("PUT", C + "/points", {"points": points}, params={"wait": "true"}))
    )
    assert done.status == qm.UpdateStatus.COMPLETED
    ids: list[Any] = [*range(20, 39), UUID]
    batch = {
        "ids": ids,
        "vectors": [vec(i) for i in range(20, 40)],
        "payloads": [{"g": f"g{i % 3}", "i": i} for i in range(20, 40)],
    }
    result(live.admin("PUT", C + "/points", {"batch": batch}))
    assert result(live.admin("POST", C + "/points/count", {"exact": True})) == {"count": 40}
    got = result(live.admin("POST", C + "/points", {"ids": [UUID, 3, 999], "with_vector": True}))
    records = [qm.Record.model_validate(r) for r in got]
    assert [r.id for r in records] == [UUID, 3]
    assert records[1].payload == {"g": "g0", "i": 3}
    unit = VECTORS[3] / np.linalg.norm(VECTORS[3])  # Cosine keeps vectors normalised, as Qdrant
    assert records[1].vector == pytest.approx(unit.tolist(), abs=1e-5)
    one = result(live.admin("GET", C + "/points/3"))
    assert one["id"] == 3 and one["payload"]["i"] == 3
    assert result(live.admin("GET", f"{C}/points/{UUID}"))["id"] == UUID
    only = result(live.admin("POST", C + "/points", {"ids": [3], "with_payload": ["i"]}))
    assert only[0]["payload"] == {"i": 3} and only[0]["vector"] is None
    excl = {"ids": [3], "with_payload": {"exclude": ["i"]}}
    assert result(live.admin("POST", C + "/points", excl))[0]["payload"] == {"g": "g0"}


def test_big_upsert_is_checked_off_the_loop_too(live: LiveServer) -> None:
    """Past ~262k floats the matrix is built in a worker thread: its refusal is the same."""
    n = 40_000
    rows = [vec(i % 40) for i in range(n - 1)] + [vec(0)[:-1]]
    body = {"batch": {"ids": list(range(1000, 1000 + n)), "vectors": rows}}
    refused = live.admin("PUT", C + "/points", body)
    assert refused.status_code == 400, refused.text[:300]
    assert f"batch.vectors[{n - 1}]" in refused.json()["status"]["error"]
    assert result(live.admin("POST", C + "/points/count", {}))["count"] == 40


def test_query_forms_agree(live: LiveServer) -> None:
    q = vec(5)
    exact = {"exact": True}
    plain = result(live.admin("POST", C + "/points/query", {"query": q, "params": exact}))
    response = qm.QueryResponse.model_validate(plain)
    assert response.points[0].id == 5 and response.points[0].score == pytest.approx(1.0, abs=1e-4)
    assert response.points[0].payload is None  # Qdrant's default: no payload unless asked
    nearest = {"query": {"nearest": q}, "params": exact, "with_payload": True, "limit": 3}
    got = result(live.admin("POST", C + "/points/query", nearest))["points"]
    assert [p["id"] for p in got] == [p.id for p in response.points[:3]]
    assert got[0]["payload"]["i"] == 5
    flt = {"must": [{"key": "g", "match": {"value": "g1"}}]}
    body = {"query": q, "filter": flt, "with_payload": True, "limit": 5, "params": exact}
    filtered = result(live.admin("POST", C + "/points/query", body))["points"]
    assert filtered and all(p["payload"]["g"] == "g1" for p in filtered)
    searches = [{"query": q, "limit": 2, "params": exact}, {"query": vec(7), "params": exact}]
    batch = result(live.admin("POST", C + "/points/query/batch", {"searches": searches}))
    assert [qm.QueryResponse.model_validate(b).points[0].id for b in batch] == [5, 7]
    assert len(batch[0]["points"]) == 2
    legacy = result(live.admin("POST", C + "/points/search", {"vector": q, "params": exact}))
    assert [qm.ScoredPoint.model_validate(p).id for p in legacy] == [p.id for p in response.points]
    paged = {"query": q, "offset": 2, "limit": 3, "params": exact}
    page = result(live.admin("POST", C + "/points/query", paged))["points"]
    assert [p["id"] for p in page] == [p.id for p in response.points[2:5]]
    by_id = result(live.admin("POST", C + "/points/query", {"query": 5, "params": exact}))
    assert [p["id"] for p in by_id["points"]] == [p.id for p in response.points]
    high = {"query": q, "score_threshold": 0.999, "params": exact}
    assert [p["id"] for p in result(live.admin("POST", C + "/points/query", high))["points"]] == [5]


def test_index_count_and_delete(live: LiveServer) -> None:
    schema = {"field_name": "g", "field_schema": {"type": "keyword", "is_tenant": True}}
    result(live.admin("PUT", C + "/index", schema))
    info = qm.CollectionInfo.model_validate(result(live.admin("GET", C)))
    assert "g" in info.payload_schema
    flt = {"must": [{"key": "g", "match": {"value": "g2"}}]}
    n_g2 = result(live.admin("POST", C + "/points/count", {"filter": flt}))["count"]
    assert n_g2 == sum(1 for i in range(40) if i % 3 == 2)
    result(live.admin("POST", C + "/points/delete", {"filter": flt}))
    result(live.admin("POST", C + "/points/delete", {"points": [0, UUID]}))
    assert result(live.admin("POST", C + "/points/count", {}))["count"] == 40 - n_g2 - 2


def test_tenants_see_only_their_points(live: LiveServer) -> None:
    acme, other = tenant_key(live, "acme"), tenant_key(live, "other", max_points=2)
    as_acme = {"points": [{"id": 100, "vector": vec(1), "payload": {"owner": "acme"}}]}
    result(live.call("PUT", C + "/points", acme, as_acme))
    assert result(live.call("POST", C + "/points/count", acme, {})) == {"count": 1}
    info = qm.CollectionInfo.model_validate(result(live.call("GET", C, acme)))
    assert info.points_count == 1  # not the collection's total
    hits = result(live.call("POST", C + "/points/query", acme, {"query": vec(1), "limit": 50}))
    assert [p["id"] for p in hits["points"]] == [100]
    # the other tenant cannot read, overwrite or delete it, whatever it sends
    assert result(live.call("POST", C + "/points", other, {"ids": [100, 1]})) == []
    assert live.call("GET", C + "/points/100", other).status_code == 404
    assert live.call("POST", C + "/points/query", other, {"query": 100}).status_code == 404
    steal = {"points": [{"id": 100, "vector": vec(2)}]}
    refusal = live.call("PUT", C + "/points", other, steal)
    assert refusal.status_code == 403 and "acme" not in refusal.text
    result(live.call("POST", C + "/points/delete", other, {"points": [100]}))
    assert result(live.admin("POST", C + "/points", {"ids": [100]}))[0]["id"] == 100
    # grants add a reader, revokes remove it; both are the admin's
    grant = {"tenant": "other", "points": [1, 3]}
    assert live.call("POST", C + "/points/grant", acme, grant).status_code == 403
    result(live.admin("POST", C + "/points/grant", grant))
    assert result(live.call("POST", C + "/points/count", other, {})) == {"count": 2}
    result(live.admin("POST", C + "/points/revoke", {"tenant": "other", "points": [3]}))
    readable = result(live.call("POST", C + "/points", other, {"ids": [1, 3]}))
    assert [p["id"] for p in readable] == [1]
    # the points quota: "other" may hold 2 points
    mine = [{"id": 200 + i, "vector": vec(i)} for i in range(3)]
    over = live.call("PUT", C + "/points", other, {"points": mine})
    assert over.status_code == 403 and "may hold 2 points" in over.text


def test_delete_collection(live: LiveServer) -> None:
    assert result(live.admin("DELETE", C)) is True
    assert result(live.admin("GET", C + "/exists")) == {"exists": False}
    assert result(live.admin("DELETE", C)) is False
