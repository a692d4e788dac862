"""``kill -9`` of the server during a keyword index creation and after collection changes.

An index creation killed before, during or after its work must leave filtered queries and
counts complete (through the index if it was acknowledged, by scanning if it never happened),
and a collection created or deleted with an acknowledgement just before the kill stays so. Why:
an index half written at a crash must never hide points from a filter. (A process crash: what
the kernel was handed survives; power loss is not simulated.)
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server.crash_checks import query_all
from tests.server.crash_writers import COLLECTION, DIM, PATH
from tests.server.live_server import LiveServer, new_admin_key, result

pytestmark = [pytest.mark.slow]

INDEX_N = 3000
INDEX_FIELDS = ["f1", "f2", "f3"]
INDEX_VALUES = ["w", "x", "y", "z"]
# seconds between sending an index creation and the kill: before, during (it takes ~50 ms
# for 3,000 points on a loaded 2-CPU box) and after its work
INDEX_KILL_DELAYS = [0.0, 0.02, 0.4]


@pytest.mark.timeout(300)
def test_index_and_collection_changes_survive_kill9(tmp_path: Path) -> None:
    """A keyword index creation killed at any moment leaves filtered queries complete (through
    the index if it was acknowledged, by scanning if it never happened); a collection created
    or deleted with an acknowledgement just before the kill stays so."""
    rng = np.random.default_rng(99)
    vectors = rng.standard_normal((INDEX_N, DIM)).astype(np.float32)
    values = rng.integers(len(INDEX_VALUES), size=(INDEX_N, len(INDEX_FIELDS)))
    payloads = [
        {f: INDEX_VALUES[values[i, j]] for j, f in enumerate(INDEX_FIELDS)} for i in range(INDEX_N)
    ]
    server = LiveServer(tmp_path / "data", admin_key=new_admin_key())
    server.start()
    try:
        result(server.admin("PUT", PATH, {"vectors": {"size": DIM, "distance": "Dot"}}))
        body = {
            "batch": {
                "ids": list(range(INDEX_N)),
                "vectors": vectors.tolist(),
                "payloads": payloads,
            }
        }
        result(server.admin("PUT", f"{PATH}/points", body, params={"wait": "true"}))
        acknowledged: set[str] = set()
        collections = {COLLECTION}
        for round_no, (field_name, delay) in enumerate(
            zip(INDEX_FIELDS, INDEX_KILL_DELAYS, strict=True), start=1
        ):
            # A collection made, and the one of the round before deleted, just before the kill.
            made = f"made{round_no}"
            result(
                server.admin(
                    "PUT", f"/collections/{made}", {"vectors": {"size": 2, "distance": "Dot"}}
                )
            )
            collections.add(made)
            if round_no > 1:
                assert result(server.admin("DELETE", f"/collections/made{round_no - 1}")) is True
                collections.discard(f"made{round_no - 1}")

            async def index_then_kill(field_name: str = field_name, delay: float = delay) -> bool:
                async with httpx.AsyncClient(timeout=60) as client:
                    request = asyncio.create_task(
                        client.put(
                            f"{server.url}{PATH}/index",
                            params={"wait": "true"},
                            json={"field_name": field_name, "field_schema": "keyword"},
                            headers={"api-key": server.admin_key},
                        )
                    )
                    await asyncio.sleep(delay)
                    answered = request.done() and request.result().status_code == 200
                    status = await asyncio.to_thread(server.kill9)
                    assert status == -signal.SIGKILL
                    try:
                        response = await request
                    except httpx.HTTPError:
                        return answered
                    return response.status_code == 200

            if asyncio.run(index_then_kill()):
                acknowledged.add(field_name)
            server.restart()

            names = {c["name"] for c in result(server.admin("GET", "/collections"))["collections"]}
            assert names == collections
            schema = result(server.admin("GET", PATH))["payload_schema"]
            assert acknowledged <= set(schema), f"acknowledged indexes lost: {acknowledged}"
            assert set(schema) <= set(INDEX_FIELDS[:round_no])
            for j, f in enumerate(INDEX_FIELDS):
                for v, value in enumerate(INDEX_VALUES):
                    flt = {"must": [{"key": f, "match": {"value": value}}]}
                    want = {i for i in range(INDEX_N) if values[i, j] == v}
                    got = query_all(server, server.admin_key, flt)
                    assert got == want, (
                        f"round {round_no}, {f}={value} (indexed: {sorted(schema)}): "
                        f"{len(want - got)} missing, {len(got - want)} extra"
                    )
                    count = {"filter": flt, "exact": True}
                    assert result(server.admin("POST", f"{PATH}/points/count", count)) == {
                        "count": len(want)
                    }
    finally:
        server.stop()
