"""The official qdrant-client gets our Python API's records, counts and deletes.

On the "docs" collection (``qdrant_fixtures.loaded``): retrieve and scroll give every record
with its payload and vector, counts match the Python API's and numpy's, a payload index keeps
filtered queries as they were, and deletes by ids and by filter leave what the Python API's
deletes leave. The tests run in file order: later ones change the collection, the last deletes
it. Why: an application moving from Qdrant must see its records and deletes behave the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from tests.server.qdrant_data import (
    COLOR_FILTER,
    DELETE_FILTER,
    DELETE_IDS,
    IDS,
    PAYLOADS,
    RANGE_FILTER,
    VECTORS,
    N,
    matches,
    overlap,
    to_qm_filter,
    truth,
)
from tests.server.qdrant_fixtures import assert_same_hits, client_queries


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
