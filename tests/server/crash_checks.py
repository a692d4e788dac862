"""The checks after a crash's restart: every point as its last acknowledged write left it.

``check_after_restart`` compares the restarted server with the writers' ``Ledger``: payloads
and float32 vector bits, deletions, the reader's grants, the writer tenant's view, the keyword
index's labels, and queries by a point's vector.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.server.crash_writers import ALL, COLORS, FIRST_ID, PATH, Ledger, State, f32, vector_of
from tests.server.live_server import LiveServer, result


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
