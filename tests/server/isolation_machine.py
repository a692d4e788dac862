"""The isolation state machine: its reads, each checked against the model.

``Isolation`` is the complete machine (the state, the writes of ``isolation_writes.py`` and the
reads here). Every read (queries with and without filters, among them filters written to widen
the view, batch queries, retrieves, single-point reads, counts, scrolls and collection info)
must show no hit, record or count outside the caller's view, and (the collections are tiny and
every limit exceeds them) exactly the caller's view.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.server.isolation_model import (
    BIG,
    ID_POOL,
    N_TENANTS,
    TAGS,
    PointId,
    matches,
    ok,
    ordered,
    spelled,
    vectors,
)
from tests.server.isolation_writes import IsolationWrites


class Isolation(IsolationWrites):
    """One run: a fresh collection; the tenants' keys live across runs (a key costs a slow
    KDF)."""

    # -- reads ---------------------------------------------------------------------------------

    def filters(self, tenant: str | None, data: st.DataObject) -> dict[str, Any] | None:
        others = [t for t in self.tenants if t != tenant]
        mine = [i for i in self.model.visible(tenant)]
        theirs = [i for i in self.model.points if i not in set(mine)]
        return data.draw(
            st.sampled_from(
                [
                    None,
                    {
                        "must": [
                            {"key": "tag", "match": {"value": data.draw(st.sampled_from(TAGS))}}
                        ]
                    },
                    # widening attempts: none may reach past the caller's view
                    {"should": [{"key": "owner", "match": {"value": t}} for t in others]},
                    {
                        "must": [
                            {"key": "owner", "match": {"value": data.draw(st.sampled_from(others))}}
                        ]
                    },
                    {"should": [{"key": "owner", "match": {"any": [*self.tenants, "admin"]}}]},
                    {"must": [{"has_id": theirs or ID_POOL}]},
                    {"should": [{"has_id": ID_POOL}, {"is_empty": {"key": "nothing"}}]},
                    {"must_not": [{"has_id": mine}]}
                    if mine
                    else {"must_not": [{"key": "tag", "match": {"value": "z"}}]},
                    {"must_not": [{"key": "owner", "match": {"value": tenant or "admin"}}]},
                    {"should": [{"must": [{"key": "n", "range": {"gte": 0}}]}, {"must_not": []}]},
                ]
            )
        )

    def reader(self, who: int) -> tuple[str | None, str]:
        if who == N_TENANTS:
            return None, self.admin
        tenant = self.tenants[who]
        return tenant, self.key(tenant)

    def expect(self, tenant: str | None, flt: dict[str, Any] | None) -> set[PointId]:
        return {
            i for i in self.model.visible(tenant) if matches(flt, i, self.model.points[i].payload)
        }

    @rule(who=st.integers(0, N_TENANTS), data=st.data())
    def query(self, who: int, data: st.DataObject) -> None:
        tenant, key = self.reader(who)
        flt = self.filters(tenant, data)
        # With a payload the server reads each hit's record; without one it may trust the
        # index alone: both routes must keep to the caller's view.
        with_payload = data.draw(st.booleans())
        legacy = data.draw(st.booleans())  # /points/search, the alias older clients use
        # a page past the first: the nearest `offset` of the caller's view are skipped, never
        # filled up with others' points
        offset = data.draw(st.sampled_from([0, 0, 1, 3]))
        body: dict[str, Any] = {"limit": BIG, "offset": offset, "with_payload": with_payload}
        body["vector" if legacy else "query"] = data.draw(vectors)
        if flt is not None:
            body["filter"] = flt
        response = self.call(
            "POST", f"{self.base}/points/{'search' if legacy else 'query'}", key, body
        )
        hits = ok(response) if legacy else ok(response)["points"]
        got = [h["id"] for h in hits]
        want = self.expect(tenant, flt)
        leaked = set(got) - self.model.visible(tenant)
        assert not leaked, f"{tenant} got points it cannot read: {ordered(leaked)} (filter {flt})"
        assert len(got) == len(set(got)), f"a point twice: {got}"
        if offset:
            assert set(got) <= want and len(got) == max(0, len(want) - offset), (
                f"{tenant}, filter {flt}, offset {offset}: got {ordered(got)}, of {ordered(want)}"
            )
        else:
            assert set(got) == want, (
                f"{tenant}, filter {flt}: got {ordered(got)}, want {ordered(want)}"
            )
        for h in hits:
            expected = self.model.points[h["id"]].payload if with_payload else None
            assert h.get("payload") == expected
        self.stats["query"] += 1
        if (
            tenant is not None
            and flt is not None
            and self.model.visible(tenant) != set(self.model.points)
        ):
            self.stats["tenant query, filtered, others' points exist"] += 1

    @rule(who=st.integers(0, N_TENANTS - 1), point_id=st.sampled_from(ID_POOL))
    def query_by_point_id(self, who: int, point_id: PointId) -> None:
        """A point id as the query (its vector): only a point the caller can read; another's
        and none at all answer the same 404."""
        tenant, key = self.reader(who)
        body = {"query": spelled(point_id), "limit": BIG}
        response = self.call("POST", f"{self.base}/points/query", key, body)
        if point_id in self.model.visible(tenant):
            got = {h["id"] for h in ok(response)["points"]}
            assert got == self.model.visible(tenant)
        else:
            assert response.status_code == 404, f"{tenant} query by {point_id}: {response.text}"
            assert '"points"' not in response.text

    @rule(who=st.integers(0, N_TENANTS), data=st.data())
    def query_batch(self, who: int, data: st.DataObject) -> None:
        tenant, key = self.reader(who)
        flts = [self.filters(tenant, data), self.filters(tenant, data)]
        searches = [
            {"query": data.draw(vectors), "limit": BIG, **({"filter": f} if f else {})}
            for f in flts
        ]
        results = ok(
            self.call("POST", f"{self.base}/points/query/batch", key, {"searches": searches})
        )
        assert len(results) == 2
        for flt, res in zip(flts, results, strict=True):
            got = {h["id"] for h in res["points"]}
            assert got <= self.model.visible(tenant), (
                f"{tenant}: leaked {got - self.model.visible(tenant)}"
            )
            assert got == self.expect(tenant, flt)

    @rule(
        who=st.integers(0, N_TENANTS),
        ids=st.lists(st.sampled_from(ID_POOL), max_size=8, unique=True),
    )
    def retrieve(self, who: int, ids: list[PointId]) -> None:
        tenant, key = self.reader(who)
        found = ok(
            self.call(
                "POST",
                f"{self.base}/points",
                key,
                {"ids": ids, "with_payload": True, "with_vector": True},
            )
        )
        got = {p["id"]: p for p in found}
        want = set(ids) & self.model.visible(tenant)
        assert set(got) == want, f"{tenant}: retrieve {ids} -> {ordered(got)}, want {ordered(want)}"
        for i, p in got.items():
            assert p["payload"] == self.model.points[i].payload
            assert p["vector"] == pytest.approx(self.model.points[i].vector, abs=1e-6)

    @rule(who=st.integers(0, N_TENANTS - 1), point_id=st.sampled_from(ID_POOL))
    def get_point(self, who: int, point_id: PointId) -> None:
        tenant, key = self.reader(who)
        response = self.call("GET", f"{self.base}/points/{spelled(point_id)}", key)
        if point_id in self.model.visible(tenant):
            assert ok(response)["payload"] == self.model.points[point_id].payload
        else:
            # Another tenant's point and no point at all answer the same: existence is not told.
            assert response.status_code == 404, f"{tenant} GET {point_id}: {response.status_code}"
            assert "payload" not in response.text

    @rule(who=st.integers(0, N_TENANTS), data=st.data())
    def count(self, who: int, data: st.DataObject) -> None:
        tenant, key = self.reader(who)
        flt = self.filters(tenant, data)
        exact = data.draw(st.booleans())
        body: dict[str, Any] = {"exact": exact}
        if flt is not None:
            body["filter"] = flt
        n = ok(self.call("POST", f"{self.base}/points/count", key, body))["count"]
        want = len(self.expect(tenant, flt))
        # an estimate may be off, but never by counting what the caller cannot read
        assert n == want if exact else n <= len(self.model.visible(tenant)), (
            f"{tenant} count (exact={exact}), filter {flt}: {n}, want {want}"
        )

    @rule(who=st.integers(0, N_TENANTS), data=st.data())
    def scroll(self, who: int, data: st.DataObject) -> None:
        """Every page, followed to the end, holds exactly what the caller may read."""
        tenant, key = self.reader(who)
        flt = self.filters(tenant, data)
        body: dict[str, Any] = {"limit": data.draw(st.integers(1, 7)), "with_payload": True}
        if flt is not None:
            body["filter"] = flt
        seen: list[Any] = []
        while True:
            page = ok(self.call("POST", f"{self.base}/points/scroll", key, body))
            seen += [p["id"] for p in page["points"]]
            if page["next_page_offset"] is None:
                break
            body["offset"] = page["next_page_offset"]
        assert set(seen) == set(self.expect(tenant, flt)), f"{tenant} scroll, filter {flt}"
        assert len(seen) == len(set(seen))

    @rule(who=st.integers(0, N_TENANTS))
    def collection_info(self, who: int) -> None:
        tenant, key = self.reader(who)
        info = ok(self.call("GET", self.base, key))
        assert info["points_count"] == len(self.model.visible(tenant)), tenant
