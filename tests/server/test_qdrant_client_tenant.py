"""The official qdrant-client with a tenant's key answers as our Python API for that tenant.

The key goes as a Bearer token (``auth_token_provider``); the tenant's queries, count,
collection info and retrieve must show its own points and those granted to it, nothing else,
with the Python API's ids and scores. Why: a tenant using the stock client must get the
tenancy's guarantees without any client of ours.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient
from qdrant_client import models as qm

from tests.server.live_server import LiveServer, result
from tests.server.qdrant_data import COLORS, DIM, LIMIT, QUERIES, VECTORS, to_qm_filter
from tests.server.qdrant_fixtures import assert_same_hits
from vectordb.collections import Catalog, CollectionConfig, parse_filter


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
