"""Fixtures and helpers of the qdrant-client tests (``conftest.py`` makes the fixtures seen).

``expected``: the Python API's answers (``qdrant_data.python_answers``); ``client``: the
official ``QdrantClient`` in REST mode with the admin key on the module's live server;
``loaded``: the "docs" collection created and filled through that client (half as a
``PointStruct`` list, half as a column ``Batch``). All three are per test module.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from tests.server.live_server import LiveServer
from tests.server.qdrant_data import (
    CHUNKS,
    DIM,
    IDS,
    LIMIT,
    PAYLOADS,
    QUERIES,
    SCORE_TOL,
    VECTORS,
    python_answers,
    to_qm_filter,
)


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return python_answers(tmp_path_factory.mktemp("python-api") / "data")


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
