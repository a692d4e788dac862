"""The writers of the crash tests: concurrent ``wait=true`` writes, each acknowledgement kept.

A ``Ledger`` records every write the server answered 200 (and every write still in flight):
creators of new points (half with a tenant key), and the admin's overwriter, deleter and
granter of points whose creation was acknowledged. ``write_until_killed`` runs them all and
sends ``kill -9`` to the server while they are still writing.
"""

from __future__ import annotations

import asyncio
import random
import signal
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from tests.server.live_server import LiveServer

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
