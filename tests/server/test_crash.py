"""``kill -9`` of the server during ``wait=true`` upserts: every acknowledged point survives.

Concurrent clients upsert batches of distinct ids with ``?wait=true``; the ids of each batch the
server answered 200 are recorded. After some hundreds of acknowledged points the server is
killed with SIGKILL (no chance to flush), restarted on the same data folder, and every
acknowledged point must be retrievable with its exact payload and vector and found by a query
with its own vector. (A process crash: what the kernel was handed survives; power loss is not
simulated.) A batch that was in flight when the server died may or may not be there, but a
point of it that is there must be exact (no torn writes). Three rounds, each killed at a
different moment, on one data folder: the points of earlier rounds must survive later crashes.
The collection, the admin key and a tenant key made before the first crash keep working, and
the tenant's acknowledged points stay visible to it (and only to it).
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.server.live_server import LiveServer, new_admin_key, result

pytestmark = [pytest.mark.slow]

COLLECTION = "crash"
DIM = 16
BATCH = 4
WRITERS = 6
TENANT = "crashco"
# acknowledged points of each round before its kill
ROUNDS = [240, 520, 360]


def vector_of(point_id: int) -> list[float]:
    """A point's vector, derived from its id: float32 values, so they survive storage exactly."""
    rng = np.random.default_rng(point_id)
    return [float(x) for x in rng.standard_normal(DIM).astype(np.float32)]


def payload_of(point_id: int, writer: int, round_no: int) -> dict[str, Any]:
    return {
        "writer": writer,
        "round": round_no,
        "id": point_id,
        "text": f"point {point_id} " + "x" * (point_id % 37),
        "nested": {"tags": [f"t{point_id % 5}", f"w{writer}"], "f": point_id / 7},
    }


@dataclass
class Ledger:
    acked: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> payload
    in_flight: dict[int, dict[str, Any]] = field(default_factory=dict)  # sent, no answer
    tenant_ids: set[int] = field(default_factory=set)  # ids the tenant wrote (acked or not)
    refused: list[str] = field(default_factory=list)  # unexpected answers before the kill


async def writer(
    client: httpx.AsyncClient,
    url: str,
    key: str,
    writer_no: int,
    round_no: int,
    ledger: Ledger,
    stop: asyncio.Event,
    is_tenant: bool,
) -> None:
    seq = 0
    while not stop.is_set():
        # ids unique over every writer and round: round, writer, sequence
        base = round_no * 10_000_000 + writer_no * 1_000_000 + seq * BATCH
        seq += 1
        ids = list(range(base, base + BATCH))
        payloads = {i: payload_of(i, writer_no, round_no) for i in ids}
        body = {"points": [{"id": i, "vector": vector_of(i), "payload": payloads[i]} for i in ids]}
        ledger.in_flight.update(payloads)
        if is_tenant:
            ledger.tenant_ids.update(ids)
        try:
            response = await client.put(
                f"{url}/collections/{COLLECTION}/points",
                params={"wait": "true"},
                json=body,
                headers={"api-key": key},
            )
        except httpx.HTTPError:
            return  # the server is gone: this batch stays "in flight"
        if response.status_code != 200:
            ledger.refused.append(f"{response.status_code}: {response.text[:300]}")
            return
        for i in ids:
            ledger.acked[i] = ledger.in_flight.pop(i)


async def write_until_killed(
    server: LiveServer, keys: list[str], round_no: int, kill_after: int, ledger: Ledger
) -> int:
    """Run the writers until ``kill_after`` points of this round are acknowledged, then
    SIGKILL the server while they are still writing. Returns the acks of this round."""
    before = len(ledger.acked)
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=WRITERS * 2)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        tasks = [
            asyncio.create_task(
                writer(
                    client,
                    server.url,
                    keys[w % len(keys)],
                    w,
                    round_no,
                    ledger,
                    stop,
                    is_tenant=(w % len(keys) == 1),
                )
            )
            for w in range(WRITERS)
        ]
        deadline = asyncio.get_running_loop().time() + 90
        while len(ledger.acked) - before < kill_after:
            if all(t.done() for t in tasks):
                break
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.005)
        # Mid-stream: the writers are still sending while the process dies.
        status = await asyncio.to_thread(server.kill9)
        assert status == -signal.SIGKILL
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return len(ledger.acked) - before


def retrieve(server: LiveServer, key: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), 256):
        chunk = ids[start : start + 256]
        points = result(
            server.call(
                "POST",
                f"/collections/{COLLECTION}/points",
                key,
                {"ids": chunk, "with_payload": True, "with_vector": True},
            )
        )
        for point in points:
            assert point["id"] not in out, f"point {point['id']} returned twice"
            out[point["id"]] = point
    return out


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def check_survivors(server: LiveServer, admin_key: str, tenant_key: str, ledger: Ledger) -> None:
    acked = sorted(ledger.acked)
    found = retrieve(server, admin_key, acked)
    missing = [i for i in acked if i not in found]
    assert not missing, (
        f"{len(missing)} of {len(acked)} acknowledged points are gone after kill -9 "
        f"(first: {missing[:10]})"
    )
    for i in acked:
        point = found[i]
        assert point["payload"] == ledger.acked[i], f"point {i}: payload changed"
        # float32 in, float32 stored: the exact same bits come back
        assert f32(point["vector"]) == f32(vector_of(i)), f"point {i}: vector changed"

    # A batch in flight at the kill: all, some or none of it may be there, but nothing torn.
    maybe = retrieve(server, admin_key, sorted(ledger.in_flight))
    for i, point in maybe.items():
        assert point["payload"] == ledger.in_flight[i], f"in-flight point {i}: torn payload"
        assert f32(point["vector"]) == f32(vector_of(i)), f"in-flight point {i}: torn vector"
    # What came through is durable now: later rounds check it like an acknowledged point.
    for i in maybe:
        ledger.acked[i] = ledger.in_flight[i]
    ledger.in_flight.clear()
    acked = sorted(ledger.acked)
    total = result(
        server.call("POST", f"/collections/{COLLECTION}/points/count", admin_key, {"exact": True})
    )
    assert total["count"] == 1 + len(acked), total  # 1: the tenant's point made first

    # A query with a point's own vector finds it (distance 0 under Euclid).
    rng = random.Random(len(acked))
    for i in rng.sample(acked, min(25, len(acked))):
        hits = result(
            server.call(
                "POST",
                f"/collections/{COLLECTION}/points/query",
                admin_key,
                {"query": vector_of(i), "limit": 10, "with_payload": False},
            )
        )["points"]
        ids = [h["id"] for h in hits]
        assert ids[:1] == [i], f"a query with point {i}'s own vector does not find it: {ids}"
        # ~0: the index computes |a|^2 + |b|^2 - 2ab in float32, whose cancellation leaves
        # a squared distance of ~1e-6 (a distance of ~1e-3) for a point and itself
        assert hits[0]["score"] == pytest.approx(0.0, abs=1e-2)

    # The tenant sees its acknowledged points and none of the admin's.
    tenant_acked = sorted(ledger.tenant_ids & set(acked))
    seen = retrieve(server, tenant_key, acked)
    assert set(seen) == set(tenant_acked), (
        f"tenant view after restart: {len(set(tenant_acked) - set(seen))} of its points "
        f"missing, {len(set(seen) - set(tenant_acked))} others' points visible"
    )


@pytest.mark.timeout(420)
def test_acknowledged_upserts_survive_kill9(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", admin_key=new_admin_key())
    server.start()
    try:
        admin = server.admin_key
        result(
            server.admin(
                "PUT",
                f"/collections/{COLLECTION}",
                {"vectors": {"size": DIM, "distance": "Euclid"}},
            )
        )
        made = result(server.admin("POST", "/admin/keys", {"tenant": TENANT}))
        tenant_key = made["key"]
        first = {"id": 1, "vector": vector_of(1), "payload": {"first": True}}
        result(
            server.call(
                "PUT",
                f"/collections/{COLLECTION}/points",
                tenant_key,
                {"points": [first]},
                params={"wait": "true"},
            )
        )
        ledger = Ledger()
        for round_no, kill_after in enumerate(ROUNDS, start=1):
            acks = asyncio.run(
                write_until_killed(server, [admin, tenant_key], round_no, kill_after, ledger)
            )
            assert not ledger.refused, f"round {round_no}: refused writes {ledger.refused[:3]}"
            assert ledger.in_flight, f"round {round_no}: no write was in flight at the kill"
            assert acks >= kill_after, (
                f"round {round_no}: only {acks} acks before the writers stopped\n"
                + server.log_tail()
            )
            server.restart()

            # The collection, the admin key and the tenant key made before the crash work.
            info = result(server.admin("GET", f"/collections/{COLLECTION}"))
            assert info["config"]["params"]["vectors"]["size"] == DIM
            mine = result(
                server.call("POST", f"/collections/{COLLECTION}/points", tenant_key, {"ids": [1]})
            )
            assert [p["id"] for p in mine] == [1]
            check_survivors(server, admin, tenant_key, ledger)
    finally:
        server.stop()
