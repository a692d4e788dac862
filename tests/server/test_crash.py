"""``kill -9`` of the server during ``wait=true`` writes: every acknowledged write survives.

Concurrent clients write with ``?wait=true`` and record each write the server answered 200:
six create points of new ids (half of them with a tenant key), and three more, with the admin
key, overwrite, delete and grant (to a second tenant) points whose creation was acknowledged.
After some hundreds of acknowledged new points the server is killed with SIGKILL (no chance to
flush) while they are still writing, restarted on the same data folder, and every point must
be as its last acknowledged write left it: the exact payload and float32 vector bits, absent
if deleted, readable by the tenant it was granted to; a write that was in flight may have
happened or not, but nothing in between (no torn writes). A query with a point's vector finds
it first, and a deleted point's vector finds it no more. Three rounds, each killed at a
different moment, on one data folder: what earlier rounds left must survive later crashes. The
collection, the admin key and the tenant keys made before the first crash keep working. (A
process crash: what the kernel was handed survives; power loss is not simulated.)
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.server.live_server import LiveServer, new_admin_key, result

pytestmark = [pytest.mark.slow]

COLLECTION = "crash"
PATH = f"/collections/{COLLECTION}"
DIM = 16
BATCH = 4
CREATORS = 6
WRITER_TENANT = "crashco"  # creates points with its own key
READER_TENANT = "readco"  # is granted points by the admin
# acknowledged new points of each round before its kill
ROUNDS = [240, 520, 360]
FIRST_ID = 1  # the writer tenant's point made before any crash
COLORS = ["red", "green", "blue", "amber"]
ALL = 10_000  # a query limit above every point count here: the answer is every match

# A point's state: (payload, vector seed), or None for absent.
State = tuple[dict[str, Any], int] | None


def vector_of(seed: int) -> list[float]:
    """float32 values (they survive storage exactly), derived from a seed."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in rng.standard_normal(DIM).astype(np.float32)]


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def payload_of(point_id: int, version: int) -> dict[str, Any]:
    return {
        "id": point_id,
        "v": version,
        "color": COLORS[(point_id + version) % len(COLORS)],  # keyword-indexed
        "text": f"point {point_id} v{version} " + "x" * ((point_id + version) % 37),
        "nested": {"tags": [f"t{point_id % 5}", f"v{version}"], "f": point_id / 7},
    }


@dataclass
class Ledger:
    acked: dict[int, State] = field(default_factory=dict)  # the last acknowledged write's
    pending: dict[int, State] = field(default_factory=dict)  # an unanswered write's
    tenant_made: set[int] = field(default_factory=set)  # ids the writer tenant creates
    granted: set[int] = field(default_factory=set)  # acknowledged grants to the reader
    grant_pending: set[int] = field(default_factory=set)
    versions: dict[int, int] = field(default_factory=dict)
    new_acks: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("overwrite", "delete", "grant"), 0)
    )
    refused: list[str] = field(default_factory=list)  # unexpected answers before the kill

    def present(self, residue: int | None = None) -> list[int]:
        """Acknowledged, present, with no write in flight (safe to change next)."""
        return [
            i
            for i, state in self.acked.items()
            if state is not None
            and i != FIRST_ID
            and i not in self.pending
            and i not in self.grant_pending
            and (residue is None or i % 3 == residue)
        ]


class Gone(Exception):
    """The server stopped answering (it was killed)."""


async def send(
    client: httpx.AsyncClient, ledger: Ledger, method: str, url: str, key: str, body: Any
) -> None:
    try:
        response = await client.request(
            method, url, params={"wait": "true"}, json=body, headers={"api-key": key}
        )
    except httpx.HTTPError:
        raise Gone from None
    if response.status_code != 200:
        ledger.refused.append(f"{method} {url}: {response.status_code}: {response.text[:300]}")
        raise Gone


async def creator(
    client: httpx.AsyncClient, url: str, key: str, no: int, round_no: int, ledger: Ledger
) -> None:
    tenant = no % 2 == 1
    for seq in range(10**6):
        # ids unique over every writer and round: round, writer, sequence
        base = round_no * 10_000_000 + no * 1_000_000 + seq * BATCH
        ids = list(range(base, base + BATCH))
        states = {i: (payload_of(i, 0), i) for i in ids}
        ledger.pending.update(states)
        if tenant:
            ledger.tenant_made.update(ids)
        points = [{"id": i, "vector": vector_of(i), "payload": states[i][0]} for i in ids]
        try:
            await send(client, ledger, "PUT", f"{url}{PATH}/points", key, {"points": points})
        except Gone:
            return
        for i in ids:
            ledger.acked[i] = ledger.pending.pop(i)
        ledger.new_acks += BATCH


async def overwriter(client: httpx.AsyncClient, url: str, key: str, ledger: Ledger) -> None:
    rng = random.Random(1)
    while True:
        ids = rng.sample(ledger.present(0), min(BATCH, len(ledger.present(0))))
        if not ids:
            await asyncio.sleep(0.01)
            continue
        states: dict[int, State] = {}
        for i in ids:
            version = ledger.versions[i] = ledger.versions.get(i, 0) + 1
            states[i] = (payload_of(i, version), i * 1000 + version)
        ledger.pending.update(states)
        points = [
            {"id": i, "vector": vector_of(s[1]), "payload": s[0]}
            for i, s in states.items()
            if s is not None
        ]
        try:
            await send(client, ledger, "PUT", f"{url}{PATH}/points", key, {"points": points})
        except Gone:
            return
        for i in ids:
            ledger.acked[i] = ledger.pending.pop(i)
        ledger.counts["overwrite"] += len(ids)


async def deleter(client: httpx.AsyncClient, url: str, key: str, ledger: Ledger) -> None:
    rng = random.Random(2)
    while True:
        candidates = ledger.present(1)
        ids = rng.sample(candidates, min(2, len(candidates)))
        if not ids:
            await asyncio.sleep(0.01)
            continue
        ledger.pending.update(dict.fromkeys(ids))
        try:
            await send(client, ledger, "POST", f"{url}{PATH}/points/delete", key, {"points": ids})
        except Gone:
            return
        for i in ids:
            ledger.acked[i] = ledger.pending.pop(i)
        ledger.counts["delete"] += len(ids)
        await asyncio.sleep(0.02)  # fewer deletes than creates: most points stay


async def granter(client: httpx.AsyncClient, url: str, key: str, ledger: Ledger) -> None:
    rng = random.Random(3)
    while True:
        candidates = [i for i in ledger.present(2) if i not in ledger.granted]
        ids = rng.sample(candidates, min(BATCH, len(candidates)))
        if not ids:
            await asyncio.sleep(0.01)
            continue
        ledger.grant_pending.update(ids)
        body = {"tenant": READER_TENANT, "points": ids}
        try:
            await send(client, ledger, "POST", f"{url}{PATH}/points/grant", key, body)
        except Gone:
            return
        ledger.granted.update(ids)
        ledger.grant_pending.difference_update(ids)
        ledger.counts["grant"] += len(ids)


async def write_until_killed(
    server: LiveServer,
    admin: str,
    tenant_key: str,
    round_no: int,
    kill_after: int,
    ledger: Ledger,
    keys: dict[str, Any],
) -> int:
    """Run the writers until ``kill_after`` new points of this round are acknowledged, then
    SIGKILL the server while they are still writing. Just before the kill, revoke one key and
    make another (``keys``: "revoked" and "made" collect them). Returns this round's new
    points."""
    before = ledger.new_acks
    url = server.url
    limits = httpx.Limits(max_connections=CREATORS * 2 + 6)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        jobs: list[Awaitable[None]] = [
            creator(client, url, tenant_key if no % 2 else admin, no, round_no, ledger)
            for no in range(CREATORS)
        ]
        maintenance: list[Callable[..., Awaitable[None]]] = [overwriter, deleter, granter]
        jobs += [job(client, url, admin, ledger) for job in maintenance]
        tasks = [asyncio.create_task(j) for j in jobs]  # type: ignore[arg-type]
        deadline = asyncio.get_running_loop().time() + 90
        while ledger.new_acks - before < kill_after:
            if all(t.done() for t in tasks) or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.005)
        # Key changes acknowledged a moment before the crash must hold after it.
        made = await client.post(
            f"{url}/admin/keys", json={"tenant": f"late{round_no}"}, headers={"api-key": admin}
        )
        doomed = keys["made"].pop() if keys["made"] else None
        if doomed is not None:
            response = await client.delete(
                f"{url}/admin/keys/{doomed['key_id']}", headers={"api-key": admin}
            )
            assert response.status_code == 200, response.text
            keys["revoked"].append(doomed)
        assert made.status_code == 200, made.text
        keys["made"].append(made.json()["result"])
        # Mid-stream: the writers are still sending while the process dies.
        status = await asyncio.to_thread(server.kill9)
        assert status == -signal.SIGKILL
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return ledger.new_acks - before


def retrieve(server: LiveServer, key: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), 256):
        body = {"ids": ids[start : start + 256], "with_payload": True, "with_vector": True}
        for point in result(server.call("POST", f"{PATH}/points", key, body)):
            assert point["id"] not in out, f"point {point['id']} returned twice"
            out[point["id"]] = point
    return out


def query_all(server: LiveServer, key: str, flt: dict[str, Any] | None) -> set[int]:
    """The ids of every point ``key`` can read that ``flt`` matches, found by a query."""
    body: dict[str, Any] = {"query": vector_of(0), "limit": ALL}
    if flt is not None:
        body["filter"] = flt
    hits = result(server.call("POST", f"{PATH}/points/query", key, body))["points"]
    ids = [h["id"] for h in hits]
    assert len(ids) == len(set(ids)), "a point twice in one answer"
    return set(ids)


def state_color(state: State) -> str | None:
    return None if state is None else state[0].get("color")


def same(point: dict[str, Any] | None, state: State) -> bool:
    if point is None or state is None:
        return point is None and state is None
    payload, seed = state
    return point["payload"] == payload and f32(point["vector"]) == f32(vector_of(seed))


def describe(point: dict[str, Any] | None) -> str:
    return "absent" if point is None else f"payload {point['payload']}"


def check_after_restart(
    server: LiveServer, admin: str, tenant_key: str, reader_key: str, ledger: Ledger
) -> None:
    ids = sorted(set(ledger.acked) | set(ledger.pending))
    found = retrieve(server, admin, ids)
    wrong = []
    for i in ids:
        allowed = [ledger.acked.get(i)]  # never acknowledged: absent
        if i in ledger.pending:
            allowed.append(ledger.pending[i])
        if not any(same(found.get(i), state) for state in allowed):
            wrong.append(f"{i}: {describe(found.get(i))}, want one of {allowed}")
    assert not wrong, f"{len(wrong)} of {len(ids)} points are not as acknowledged: {wrong[:5]}"
    # What the restart shows is durable now: later rounds hold it to that.
    for i in ids:
        candidates = [ledger.acked.get(i), ledger.pending.get(i)]
        ledger.acked[i] = next(state for state in candidates if same(found.get(i), state))
    ledger.pending.clear()
    present = sorted(i for i, state in ledger.acked.items() if state is not None)
    count = result(server.admin("POST", f"{PATH}/points/count", {"exact": True}))["count"]
    assert count == 1 + len(present)  # 1: the tenant's point made first

    # The reader sees what was granted to it (an unanswered grant: either way) and no more.
    seen = set(retrieve(server, reader_key, present))
    must = {i for i in ledger.granted if i in set(present)}
    assert must <= seen, f"acknowledged grants lost: {sorted(must - seen)[:10]}"
    extra = seen - must - ledger.grant_pending
    assert not extra, f"the reader sees points never granted to it: {sorted(extra)[:10]}"
    ledger.granted |= seen
    ledger.grant_pending.clear()

    # The writer tenant sees the points it made, and none of the admin's: by id, and through
    # the index's tenant label (a query for everything).
    mine = {i for i in present if i in ledger.tenant_made} | {FIRST_ID}
    for how, seen in (
        ("retrieve", set(retrieve(server, tenant_key, [*present, FIRST_ID]))),
        ("query", query_all(server, tenant_key, None)),
    ):
        assert seen == mine, (
            f"writer tenant after restart ({how}): {len(mine - seen)} of its points missing, "
            f"{len(seen - mine)} others' points visible"
        )
    readable = {i for i in present if i in ledger.granted}
    assert query_all(server, reader_key, None) == readable, "the reader's label after restart"

    # The keyword index's labels survived too: a must-match on the indexed field (searched
    # through that value's label) finds every point of that value, and nothing else.
    for color in COLORS:
        flt = {"must": [{"key": "color", "match": {"value": color}}]}
        want = {i for i in present if state_color(ledger.acked[i]) == color}
        got = query_all(server, admin, flt)
        assert got == want, (
            f"color {color} after restart: {len(want - got)} missing, {len(got - want)} extra"
        )

    # A query with a point's vector finds it first; a deleted point's vector no longer does.
    rng = random.Random(len(present))
    for i in rng.sample(present, min(20, len(present))):
        state = ledger.acked[i]
        assert state is not None
        body = {"query": vector_of(state[1]), "limit": 5}
        hits = result(server.admin("POST", f"{PATH}/points/query", body))["points"]
        assert [h["id"] for h in hits[:1]] == [i], f"query by point {i}'s vector: {hits}"
        # ~0: |a|^2 + |b|^2 - 2ab in float32 leaves a distance of ~1e-3 for a point and itself
        assert hits[0]["score"] == pytest.approx(0.0, abs=1e-2)
    # (deleted points are never overwritten: their vector is their creation's, seed = id)
    deleted = sorted(i for i, state in ledger.acked.items() if state is None)
    for i in rng.sample(deleted, min(10, len(deleted))):
        body = {"query": vector_of(i), "limit": 5}
        hits = result(server.admin("POST", f"{PATH}/points/query", body))["points"]
        assert i not in [h["id"] for h in hits], f"deleted point {i} is found: {hits}"


@pytest.mark.timeout(420)
def test_acknowledged_writes_survive_kill9(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", admin_key=new_admin_key())
    server.start()
    try:
        admin = server.admin_key
        result(server.admin("PUT", PATH, {"vectors": {"size": DIM, "distance": "Euclid"}}))
        index = {"field_name": "color", "field_schema": "keyword"}
        result(server.admin("PUT", f"{PATH}/index", index))
        tenant_key = result(server.admin("POST", "/admin/keys", {"tenant": WRITER_TENANT}))["key"]
        reader_key = result(server.admin("POST", "/admin/keys", {"tenant": READER_TENANT}))["key"]
        first = {"id": FIRST_ID, "vector": vector_of(FIRST_ID), "payload": {"first": True}}
        body = {"points": [first]}
        result(server.call("PUT", f"{PATH}/points", tenant_key, body, params={"wait": "true"}))
        ledger = Ledger()
        keys: dict[str, Any] = {"made": [], "revoked": []}
        for round_no, kill_after in enumerate(ROUNDS, start=1):
            made = asyncio.run(
                write_until_killed(server, admin, tenant_key, round_no, kill_after, ledger, keys)
            )
            assert not ledger.refused, f"round {round_no}: refused writes {ledger.refused[:3]}"
            assert made >= kill_after, (
                f"round {round_no}: only {made} new points before the writers stopped\n"
                + server.log_tail()
            )
            assert ledger.pending, f"round {round_no}: no write was in flight at the kill"
            server.restart()

            # The collection and the keys made before the first crash work.
            info = result(server.admin("GET", PATH))
            assert info["config"]["params"]["vectors"]["size"] == DIM
            mine = result(server.call("POST", f"{PATH}/points", tenant_key, {"ids": [FIRST_ID]}))
            assert [p["id"] for p in mine] == [FIRST_ID]
            # The key made just before the kill works; the one revoked then stays revoked.
            for key in keys["made"]:
                assert result(server.call("POST", f"{PATH}/points/count", key["key"], {})) == {
                    "count": 0
                }
            for key in keys["revoked"]:
                response = server.call("POST", f"{PATH}/points/count", key["key"], {})
                assert response.status_code in (401, 403), response.text
            check_after_restart(server, admin, tenant_key, reader_key, ledger)
        # The run did what it is about (or it proves nothing).
        assert all(n > 0 for n in ledger.counts.values()), ledger.counts
        assert len(keys["revoked"]) == len(ROUNDS) - 1
    finally:
        server.stop()


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
