"""The official qdrant-client (REST mode) against our live server gets our Python API's answers.

One seeded data set (500 x 32, payloads with a keyword, an integer and a float field) goes into
the server through ``QdrantClient`` (half as a ``PointStruct`` list, half as a column ``Batch``)
and into a ``vectordb.collections`` collection of its own folder through the Python API, in the
same chunks and order. Then both answer the same calls: plain, keyword-filtered and
range-filtered queries (the same ids in the same order, scores within 1e-4), retrieve, scroll,
count,
the payload index's filtered queries, delete by ids and by filter, and queries after them. The
server's scores are also checked against numpy's exact ones for the ids it returns.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from tests.server.live_server import LiveServer, result
from vectordb.collections import Catalog, CollectionConfig, parse_filter

N, DIM, N_QUERIES, LIMIT = 500, 32, 12, 10
COLORS = ["red", "green", "blue", "amber", "violet"]
SCORE_TOL = 1e-4

# The filters both sides run, in Qdrant's JSON form (the client's models serialise to these).
COLOR_FILTER = {"must": [{"key": "color", "match": {"value": "blue"}}]}
RANGE_FILTER = {"must": [{"key": "rank", "range": {"gte": 100, "lt": 300}}]}
MIXED_FILTER = {
    "should": [
        {"key": "color", "match": {"value": "red"}},
        {"key": "score", "range": {"gt": 0.8}},
    ],
    "must_not": [{"key": "rank", "range": {"lt": 50}}],
}
DELETE_IDS = list(range(0, 60, 3))
DELETE_FILTER = {"must": [{"key": "color", "match": {"value": "green"}}]}


def data() -> tuple[list[int], np.ndarray, list[dict[str, Any]], np.ndarray]:
    rng = np.random.default_rng(20261126)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    ids = [int(i) for i in rng.permutation(10 * N)[:N]]
    payloads = [
        {
            "color": COLORS[int(rng.integers(len(COLORS)))],
            "rank": i,
            "score": float(np.round(rng.random(), 4)),
        }
        for i in range(N)
    ]
    queries = rng.standard_normal((N_QUERIES, DIM)).astype(np.float32)
    return ids, vectors, payloads, queries


IDS, VECTORS, PAYLOADS, QUERIES = data()
ROW = {point_id: row for row, point_id in enumerate(IDS)}
HALF = N // 2
# Chunks in order: the first half as a points list, the second as a column batch.
CHUNKS = [(0, HALF), (HALF, N)]


def to_qm_filter(value: dict[str, Any]) -> qm.Filter:
    """The client's model of a JSON filter (what an application would build)."""
    return qm.Filter.model_validate(value)


# -- the Python API, in its own folder ------------------------------------------------------


def python_answers(folder: Path) -> dict[str, Any]:
    """Everything the server is compared with, from the Python API on the same data."""

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        catalog = await Catalog.open(str(folder))
        try:
            c = await catalog.create("docs", CollectionConfig(DIM, distance="Cosine"))
            for lo, hi in CHUNKS:
                await c.upsert(IDS[lo:hi], VECTORS[lo:hi], PAYLOADS[lo:hi])

            async def queries(name: str, flt: dict[str, Any] | None) -> None:
                for exact in (True, False):
                    hits = await c.query(
                        QUERIES, limit=LIMIT, filter=parse_filter(flt), exact=exact
                    )
                    out[name, exact] = [[(h.id, h.score) for h in row] for row in hits]

            await queries("plain", None)
            await queries("color", COLOR_FILTER)
            await queries("range", RANGE_FILTER)
            await queries("mixed", MIXED_FILTER)
            out["count_all"] = await c.count(None)
            out["count_color"] = await c.count(parse_filter(COLOR_FILTER))
            out["count_range"] = await c.count(parse_filter(RANGE_FILTER))
            await c.create_payload_index("color")
            await queries("indexed_color", COLOR_FILTER)
            await c.delete([IDS[i] for i in DELETE_IDS])
            flt = parse_filter(DELETE_FILTER)
            assert flt is not None
            await c.delete_where(flt)
            out["count_after_delete"] = await c.count(None)
            await queries("after_delete", None)
        finally:
            await catalog.aclose()
        return out

    return asyncio.run(run())


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return python_answers(tmp_path_factory.mktemp("python-api") / "data")


# -- the client ------------------------------------------------------------------------------


def make_client(live: LiveServer, key: str) -> QdrantClient:
    with warnings.catch_warnings():
        # Our server listens on plain HTTP on loopback; the client warns about the key.
        warnings.filterwarnings("ignore", message="Api key is used with an insecure connection")
        return QdrantClient(
            url=live.url,
            api_key=key,
            prefer_grpc=False,
            check_compatibility=False,
            timeout=60,
        )


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[QdrantClient]:
    c = make_client(live, live.admin_key)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def loaded(client: QdrantClient) -> str:
    """The "docs" collection, created and filled through the client."""
    assert client.collection_exists("docs") is False
    assert client.create_collection(
        "docs", vectors_config=qm.VectorParams(size=DIM, distance=qm.Distance.COSINE)
    )
    lo, hi = CHUNKS[0]
    done = client.upsert(
        "docs",
        points=[
            qm.PointStruct(id=IDS[i], vector=VECTORS[i].tolist(), payload=PAYLOADS[i])
            for i in range(lo, hi)
        ],
        wait=True,
    )
    assert done.status == qm.UpdateStatus.COMPLETED
    lo, hi = CHUNKS[1]
    done = client.upsert(
        "docs",
        points=qm.Batch(ids=IDS[lo:hi], vectors=VECTORS[lo:hi].tolist(), payloads=PAYLOADS[lo:hi]),
        wait=True,
    )
    assert done.status == qm.UpdateStatus.COMPLETED
    return "docs"


def client_queries(
    client: QdrantClient, flt: dict[str, Any] | None, exact: bool
) -> list[list[tuple[Any, float]]]:
    out = []
    for q in QUERIES:
        response = client.query_points(
            "docs",
            query=q.tolist(),
            query_filter=to_qm_filter(flt) if flt is not None else None,
            search_params=qm.SearchParams(exact=True) if exact else None,
            limit=LIMIT,
            with_payload=True,
        )
        out.append([(p.id, p.score) for p in response.points])
    return out


def assert_same_hits(
    got: list[list[tuple[Any, float]]], want: list[list[tuple[Any, float]]], what: str
) -> None:
    assert len(got) == len(want)
    for qi, (g, w) in enumerate(zip(got, want, strict=True)):
        assert [i for i, _ in g] == [i for i, _ in w], f"{what}, query {qi}: ids differ"
        for (i, gs), (_, ws) in zip(g, w, strict=True):
            assert gs == pytest.approx(ws, abs=SCORE_TOL), f"{what}, query {qi}, id {i}"


def exact_cosine(point_id: int, query: np.ndarray) -> float:
    v = VECTORS[ROW[point_id]].astype(np.float64)
    q = query.astype(np.float64)
    return float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))


def matches(flt: dict[str, Any] | None, index: int) -> bool:
    f = parse_filter(flt)
    return f is None or f.matches(IDS[index], PAYLOADS[index])


# -- the tests (in file order: later ones change the collection) -------------------------------


def test_collection_info(client: QdrantClient, loaded: str) -> None:
    assert client.collection_exists(loaded) is True
    assert client.collection_exists("nope") is False
    info = client.get_collection(loaded)
    params = info.config.params.vectors
    assert isinstance(params, qm.VectorParams)
    assert params.size == DIM
    assert params.distance == qm.Distance.COSINE
    assert info.points_count == N
    names = [c.name for c in client.get_collections().collections]
    assert loaded in names


def truth(flt: dict[str, Any] | None) -> list[list[int]]:
    """numpy's exact top ``LIMIT`` ids per query among the points ``flt`` matches."""
    rows = [i for i in range(N) if matches(flt, i)]
    v = VECTORS[rows].astype(np.float64)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = QUERIES.astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    order = np.argsort(-(q @ v.T), axis=1)[:, :LIMIT]
    return [[IDS[rows[j]] for j in row] for row in order]


def overlap(got: list[list[tuple[Any, float]]], want: list[list[int]]) -> float:
    found = sum(len({i for i, _ in g} & set(w)) for g, w in zip(got, want, strict=True))
    return found / sum(len(w) for w in want)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "index"])
@pytest.mark.parametrize(
    ("name", "flt"),
    [("plain", None), ("color", COLOR_FILTER), ("range", RANGE_FILTER), ("mixed", MIXED_FILTER)],
)
def test_query_same_as_python_api(
    client: QdrantClient,
    loaded: str,
    expected: dict[str, Any],
    name: str,
    flt: dict[str, Any] | None,
    exact: bool,
) -> None:
    got = client_queries(client, flt, exact)
    allowed = {IDS[i] for i in range(N) if matches(flt, i)}
    for q, hits in zip(QUERIES, got, strict=True):
        assert len(hits) == LIMIT
        assert {i for i, _ in hits} <= allowed, f"{name}: a hit outside the filter"
        scores = [s for _, s in hits]
        assert scores == sorted(scores, reverse=True)
        for i, s in hits:
            assert s == pytest.approx(exact_cosine(i, q), abs=SCORE_TOL)
    want = truth(flt)
    if exact:
        # Exact search: the very same answer as the Python API, and as numpy.
        assert_same_hits(got, expected[name, True], name)
        assert [[i for i, _ in row] for row in got] == want
    else:
        # The index is approximate (two builds of it need not agree on near ties): both
        # answers must be good, and mostly the same.
        mine = expected[name, False]
        assert overlap(got, want) >= 0.9, f"{name}: server recall@{LIMIT}"
        assert overlap(mine, want) >= 0.9, f"{name}: Python API recall@{LIMIT}"
        assert overlap(got, [[i for i, _ in row] for row in mine]) >= 0.85


def test_query_with_search_params_and_vectors(client: QdrantClient, loaded: str) -> None:
    response = client.query_points(
        "docs",
        query=QUERIES[0].tolist(),
        limit=3,
        with_payload=["color"],
        with_vectors=True,
        search_params=qm.SearchParams(exact=True),
        query_filter=to_qm_filter(COLOR_FILTER),
    )
    assert len(response.points) == 3
    for p in response.points:
        assert p.payload == {"color": "blue"}
        v = VECTORS[ROW[p.id]]
        # Cosine: the stored vector is the normalised one, as in Qdrant
        np.testing.assert_allclose(p.vector, v / np.linalg.norm(v), atol=1e-6)


def test_query_batch_and_by_point_id(client: QdrantClient, loaded: str) -> None:
    """query_batch_points answers as the single queries do; a point id as the query uses that
    point's vector."""
    requests = [
        qm.QueryRequest(
            query=q.tolist(),
            limit=LIMIT,
            filter=to_qm_filter(flt) if flt else None,
            params=qm.SearchParams(exact=True),
        )
        for q, flt in zip(
            QUERIES[:4], [None, COLOR_FILTER, RANGE_FILTER, MIXED_FILTER], strict=True
        )
    ]
    batch = client.query_batch_points("docs", requests=requests)
    assert len(batch) == len(requests)
    for response, flt, want in zip(
        batch, [None, COLOR_FILTER, RANGE_FILTER, MIXED_FILTER], range(4), strict=True
    ):
        assert [p.id for p in response.points] == truth(flt)[want]
    by_id = client.query_points(
        "docs", query=IDS[42], limit=3, search_params=qm.SearchParams(exact=True)
    )
    assert by_id.points[0].id == IDS[42]
    assert by_id.points[0].score == pytest.approx(1.0, abs=SCORE_TOL)


@pytest.mark.parametrize("distance", [qm.Distance.DOT, qm.Distance.EUCLID])
def test_other_distances_score_as_qdrant(client: QdrantClient, distance: qm.Distance) -> None:
    """Dot: the inner product, largest first; Euclid: the distance, smallest first."""
    name = f"dist-{distance.value.lower()}"
    client.create_collection(name, vectors_config=qm.VectorParams(size=DIM, distance=distance))
    n = 200
    client.upsert(name, points=qm.Batch(ids=IDS[:n], vectors=VECTORS[:n].tolist()), wait=True)
    v = VECTORS[:n].astype(np.float64)
    for q in QUERIES[:4]:
        got = client.query_points(
            name, query=q.tolist(), limit=LIMIT, search_params=qm.SearchParams(exact=True)
        ).points
        if distance == qm.Distance.DOT:
            scores = v @ q.astype(np.float64)
            order = np.argsort(-scores)[:LIMIT]
        else:
            scores = np.linalg.norm(v - q.astype(np.float64), axis=1)
            order = np.argsort(scores)[:LIMIT]
        assert [p.id for p in got] == [IDS[j] for j in order]
        np.testing.assert_allclose([p.score for p in got], scores[order], atol=1e-3, rtol=1e-5)
        # the vector comes back as it went in (only Cosine normalises)
        record = client.retrieve(name, ids=[IDS[0]], with_vectors=True)[0]
        np.testing.assert_array_equal(np.asarray(record.vector, np.float32), VECTORS[0])
    assert client.delete_collection(name)


def test_uuid_ids(client: QdrantClient) -> None:
    """UUID point ids, as uuid.UUID or str in any case, name one point."""
    client.create_collection("uuids", vectors_config=qm.VectorParams(size=DIM, distance="Cosine"))
    ids = [uuid.UUID(int=i * 7919 + 1) for i in range(8)]
    client.upsert(
        "uuids",
        points=[
            qm.PointStruct(
                id=str(u).upper() if i % 2 else str(u), vector=VECTORS[i].tolist(), payload={"i": i}
            )
            for i, u in enumerate(ids)
        ],
        wait=True,
    )
    got = client.retrieve("uuids", ids=[ids[1], str(ids[2]).upper()])
    assert sorted((r.id, r.payload["i"]) for r in got) == sorted(
        [(str(ids[1]), 1), (str(ids[2]), 2)]
    )
    hit = client.query_points("uuids", query=VECTORS[3].tolist(), limit=1).points[0]
    assert hit.id == str(ids[3])
    assert client.count("uuids").count == 8
    client.delete("uuids", points_selector=[ids[3]], wait=True)
    assert client.count("uuids").count == 7
    assert client.delete_collection("uuids")


def test_retrieve(client: QdrantClient, loaded: str) -> None:
    wanted = [IDS[7], IDS[300], IDS[499], 10 * N + 1]  # the last one does not exist
    records = client.retrieve("docs", ids=wanted, with_payload=True, with_vectors=True)
    by_id = {r.id: r for r in records}
    assert set(by_id) == set(wanted[:3])
    for i in (7, 300, 499):
        r = by_id[IDS[i]]
        assert r.payload == PAYLOADS[i]
        v = VECTORS[i]
        np.testing.assert_allclose(r.vector, v / np.linalg.norm(v), atol=1e-6)
    bare = client.retrieve("docs", ids=[IDS[1]], with_payload=False, with_vectors=False)
    assert [(r.id, r.payload, r.vector) for r in bare] == [(IDS[1], None, None)]


def test_scroll_pages_through_every_match_in_id_order(client: QdrantClient, loaded: str) -> None:
    for flt in (None, COLOR_FILTER):
        seen: list[Any] = []
        offset = None
        while True:
            records, offset = client.scroll(
                "docs",
                scroll_filter=to_qm_filter(flt) if flt else None,
                limit=64,
                offset=offset,
                with_payload=True,
            )
            seen += [r.id for r in records]
            for r in records:
                assert r.payload == PAYLOADS[IDS.index(r.id)]
            if offset is None:
                break
        wanted = [IDS[i] for i in range(N) if flt is None or matches(flt, i)]
        assert seen == sorted(wanted)


def test_count(client: QdrantClient, loaded: str, expected: dict[str, Any]) -> None:
    assert client.count("docs", exact=True).count == N == expected["count_all"]
    for name, flt in (("count_color", COLOR_FILTER), ("count_range", RANGE_FILTER)):
        got = client.count("docs", count_filter=to_qm_filter(flt), exact=True).count
        assert got == expected[name] == sum(matches(flt, i) for i in range(N))


def test_payload_index_then_filtered_query(
    client: QdrantClient, loaded: str, expected: dict[str, Any]
) -> None:
    done = client.create_payload_index(
        "docs", field_name="color", field_schema=qm.PayloadSchemaType.KEYWORD, wait=True
    )
    assert done.status in (qm.UpdateStatus.COMPLETED, qm.UpdateStatus.ACKNOWLEDGED)
    assert "color" in client.get_collection("docs").payload_schema
    got = client_queries(client, COLOR_FILTER, exact=True)
    assert_same_hits(got, expected["indexed_color", True], "indexed")
    got = client_queries(client, COLOR_FILTER, exact=False)
    assert overlap(got, truth(COLOR_FILTER)) >= 0.9


def test_delete_by_ids_and_by_filter(
    client: QdrantClient, loaded: str, expected: dict[str, Any]
) -> None:
    gone = [IDS[i] for i in DELETE_IDS]
    done = client.delete("docs", points_selector=qm.PointIdsList(points=gone), wait=True)
    assert done.status == qm.UpdateStatus.COMPLETED
    assert client.retrieve("docs", ids=gone) == []
    done = client.delete(
        "docs", points_selector=qm.FilterSelector(filter=to_qm_filter(DELETE_FILTER)), wait=True
    )
    assert done.status == qm.UpdateStatus.COMPLETED
    left = [i for i in range(N) if i not in set(DELETE_IDS) and not matches(DELETE_FILTER, i)]
    assert client.count("docs", exact=True).count == len(left) == expected["count_after_delete"]
    assert client.count("docs", count_filter=to_qm_filter(DELETE_FILTER)).count == 0
    got = client_queries(client, None, exact=True)
    assert_same_hits(got, expected["after_delete", True], "after delete")
    assert {i for row in got for i, _ in row}.isdisjoint(gone)


def test_delete_collection(client: QdrantClient, loaded: str) -> None:
    assert client.delete_collection("docs") is True
    assert client.collection_exists("docs") is False
    assert "docs" not in [c.name for c in client.get_collections().collections]


def test_tenant_client_same_as_python_api(
    live: LiveServer, client: QdrantClient, tmp_path: Path
) -> None:
    """A client with a tenant's key (sent as a Bearer token) answers as the Python API does
    for that tenant: its own points and those granted to it, nothing else."""
    n_tenant, n_admin, granted = 150, 150, list(range(150, 180))
    ids = list(range(n_tenant + n_admin))
    payloads = [{"color": COLORS[i % len(COLORS)], "rank": i} for i in ids]
    flt = {"must": [{"key": "rank", "range": {"gte": 20}}]}

    async def python_side() -> dict[str, Any]:
        catalog = await Catalog.open(str(tmp_path / "python-api"))
        try:
            c = await catalog.create("tenanted", CollectionConfig(DIM, distance="Cosine"))
            await c.upsert(
                ids[n_tenant:], VECTORS[n_tenant : n_tenant + n_admin], payloads[n_tenant:]
            )
            await c.upsert(ids[:n_tenant], VECTORS[:n_tenant], payloads[:n_tenant], tenant="acme")
            await c.grant(granted, "acme")
            out = {}
            for name, f in (("plain", None), ("filtered", flt)):
                hits = await c.query(
                    QUERIES, limit=LIMIT, filter=parse_filter(f), tenant="acme", exact=True
                )
                out[name] = [[(h.id, h.score) for h in row] for row in hits]
            out["count"] = await c.count(None, tenant="acme")
            return out
        finally:
            await catalog.aclose()

    want = asyncio.run(python_side())

    key = result(live.admin("POST", "/admin/keys", {"tenant": "acme"}))["key"]
    client.create_collection(
        "tenanted", vectors_config=qm.VectorParams(size=DIM, distance="Cosine")
    )
    client.upsert(
        "tenanted",
        points=qm.Batch(
            ids=ids[n_tenant:],
            vectors=VECTORS[n_tenant : n_tenant + n_admin].tolist(),
            payloads=payloads[n_tenant:],
        ),
        wait=True,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Auth token provider is used with an insecure")
        tenant = QdrantClient(
            url=live.url,
            auth_token_provider=lambda: key,  # Authorization: Bearer <key>
            prefer_grpc=False,
            check_compatibility=False,
            timeout=60,
        )
    try:
        tenant.upsert(
            "tenanted",
            points=qm.Batch(
                ids=ids[:n_tenant],
                vectors=VECTORS[:n_tenant].tolist(),
                payloads=payloads[:n_tenant],
            ),
            wait=True,
        )
        grant = {"tenant": "acme", "points": granted}
        result(live.admin("POST", "/collections/tenanted/points/grant", grant))
        for name, f in (("plain", None), ("filtered", flt)):
            got = []
            for q in QUERIES:
                response = tenant.query_points(
                    "tenanted",
                    query=q.tolist(),
                    query_filter=to_qm_filter(f) if f else None,
                    search_params=qm.SearchParams(exact=True),
                    limit=LIMIT,
                )
                got.append([(p.id, p.score) for p in response.points])
            assert_same_hits(got, want[name], f"tenant {name}")
            assert {i for row in got for i, _ in row} <= set(ids[:n_tenant]) | set(granted)
        assert (
            tenant.count("tenanted", exact=True).count == want["count"] == n_tenant + len(granted)
        )
        assert tenant.get_collection("tenanted").points_count == want["count"]
        others = [i for i in ids if i >= n_tenant and i not in granted][:20]
        assert tenant.retrieve("tenanted", ids=others) == []
    finally:
        tenant.close()
        client.delete_collection("tenanted")
