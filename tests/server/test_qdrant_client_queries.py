"""The official qdrant-client (REST mode) against our live server gets our Python API's answers.

One seeded data set (``qdrant_data.py``) goes into the server through ``QdrantClient`` (half as
a ``PointStruct`` list, half as a column ``Batch``) and into a ``vectordb.collections``
collection of its own folder through the Python API, in the same chunks and order. Then both
answer the same queries: plain, keyword-filtered, range-filtered and mixed (exact: the same ids
in the same order, scores within 1e-4; through the index: both good, and mostly the same),
batches and queries by point id, Dot and Euclid collections, and UUID ids. The server's scores
are also checked against numpy's exact ones for the ids it returns. Why: an application built
on the official client must get the answers our Python API gives.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from tests.server.qdrant_data import (
    COLOR_FILTER,
    DIM,
    IDS,
    LIMIT,
    MIXED_FILTER,
    QUERIES,
    RANGE_FILTER,
    ROW,
    SCORE_TOL,
    VECTORS,
    N,
    exact_cosine,
    matches,
    overlap,
    to_qm_filter,
    truth,
)
from tests.server.qdrant_fixtures import assert_same_hits, client_queries


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
