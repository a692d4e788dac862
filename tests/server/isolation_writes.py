"""The isolation state machine's writes: upserts, grants and revokes, deletes, key changes.

Each rule does one write over HTTP and updates the model as the tenancy rules say (see
``isolation_model.py``); a write the rules refuse must answer 403 and change nothing.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.server.isolation_model import (
    BIG,
    DIM,
    ID_POOL,
    N_TENANTS,
    TAGS,
    PointId,
    PointModel,
    assert_denied,
    matches,
    ok,
    ordered,
    some_ids,
    spelled,
    vectors,
)
from tests.server.isolation_state import IsolationState


class IsolationWrites(IsolationState):
    """The write rules of the isolation machine."""

    # -- writes --------------------------------------------------------------------------------

    @rule(who=st.integers(0, N_TENANTS), ids=some_ids, data=st.data())
    def upsert(self, who: int, ids: list[PointId], data: st.DataObject) -> None:
        self._upsert(who, ids, data)

    @rule(who=st.integers(0, N_TENANTS - 1), ids=some_ids, data=st.data())
    def tenant_upsert(self, who: int, ids: list[PointId], data: st.DataObject) -> None:
        self._upsert(who, ids, data)

    def _upsert(self, who: int, ids: list[PointId], data: st.DataObject) -> None:
        tenant = self.tenants[who] if who < N_TENANTS else None
        key = self.key(tenant) if tenant is not None else self.admin
        # writes spell UUIDs in upper case, reads in the canonical form: one point to the server
        points = [
            {"id": spelled(i), "vector": data.draw(vectors), "payload": self.payload(data)}
            for i in ids
        ]
        use_batch = data.draw(st.booleans())
        body = (
            {
                "batch": {
                    "ids": [spelled(i) for i in ids],
                    "vectors": [p["vector"] for p in points],
                    "payloads": [p["payload"] for p in points],
                }
            }
            if use_batch
            else {"points": points}
        )
        response = self.call("PUT", f"{self.base}/points", key, body, wait="true")
        forbidden = tenant is not None and any(
            i in self.model.points and self.model.points[i].owner != tenant for i in ids
        )
        if forbidden:
            assert response.status_code == 403, response.text
            assert "payload" not in response.text
            self.check_unchanged()  # a refused write changes nothing
            self.stats["upsert refused"] += 1
            return
        ok(response)
        self.stats["upsert"] += 1
        for i, p in zip(ids, points, strict=True):
            old = self.model.points.get(i)
            if old is None:
                readers = {tenant} if tenant is not None else set()
                self.model.points[i] = PointModel(tenant, readers, p["payload"], p["vector"])
            else:  # an overwrite keeps the owner and the readers
                old.payload, old.vector = p["payload"], p["vector"]

    @rule(who=st.integers(0, N_TENANTS - 1), grant=st.booleans(), data=st.data())
    def access(self, who: int, grant: bool, data: st.DataObject) -> None:
        tenant = self.tenants[who]
        # mostly points that exist, and one that may not
        existing = ordered(self.model.points)
        ids = data.draw(some_ids)
        if existing:
            ids = ordered(set(ids[:1]) | set(data.draw(st.lists(st.sampled_from(existing)))))
        path = f"{self.base}/points/{'grant' if grant else 'revoke'}"
        body = {"tenant": tenant, "points": [spelled(i) for i in ids]}
        ok(self.call("POST", path, self.admin, body))
        self.stats["grant" if grant else "revoke"] += 1
        for i in ids:
            p = self.model.points.get(i)
            if p is None:
                continue
            if grant:
                p.readers.add(tenant)
            else:
                p.readers.discard(tenant)
                if p.owner == tenant:
                    p.owner = None

    @rule(who=st.integers(0, N_TENANTS - 1), data=st.data())
    def tenant_cannot_grant(self, who: int, data: st.DataObject) -> None:
        tenant = self.tenants[who]
        ids = data.draw(some_ids)
        for op in ("grant", "revoke"):
            response = self.call(
                "POST",
                f"{self.base}/points/{op}",
                self.key(tenant),
                {"tenant": tenant, "points": ids},
            )
            assert response.status_code == 403, response.text
        self.check_unchanged()

    @rule(field=st.sampled_from(["tag", "owner"]))
    def payload_index(self, field: str) -> None:
        """A keyword index: a must-match on it then searches that value's label; for a tenant
        the label of one value holds other tenants' points too."""
        body = {"field_name": field, "field_schema": "keyword"}
        ok(self.call("PUT", f"{self.base}/index", self.admin, body, wait="true"))
        self.stats["payload index"] += 1

    def _apply_delete(self, tenant: str, ids: set[PointId]) -> None:
        for i in ids:
            p = self.model.points.get(i)
            if p is None:
                continue
            if p.owner == tenant:
                del self.model.points[i]
                self.stats["deleted"] += 1
            elif tenant in p.readers:
                p.readers.discard(tenant)
                self.stats["grant dropped by delete"] += 1

    @rule(who=st.integers(0, N_TENANTS - 1), data=st.data())
    def delete_ids(self, who: int, data: st.DataObject) -> None:
        tenant = self.tenants[who]
        # mostly points it can read (its own and its grants), and some it cannot
        readable = ordered(self.model.visible(tenant))
        ids = data.draw(some_ids)
        if readable:
            ids = ordered(set(ids[:2]) | set(data.draw(st.lists(st.sampled_from(readable)))))
        ok(
            self.call(
                "POST",
                f"{self.base}/points/delete",
                self.key(tenant),
                {"points": [spelled(i) for i in ids]},
                wait="true",
            )
        )
        self._apply_delete(tenant, set(ids))
        self.check_unchanged()

    @rule(who=st.integers(0, N_TENANTS - 1), tag=st.sampled_from(TAGS), data=st.data())
    def delete_filter(self, who: int, tag: str, data: st.DataObject) -> None:
        tenant = self.tenants[who]
        other = data.draw(st.sampled_from(self.tenants))
        # A filter that names the whole id pool and another tenant's claims must still only
        # reach the caller's own view.
        flt = data.draw(
            st.sampled_from(
                [
                    {"must": [{"key": "tag", "match": {"value": tag}}]},
                    {"should": [{"key": "owner", "match": {"value": other}}, {"has_id": ID_POOL}]},
                ]
            )
        )
        ok(
            self.call(
                "POST", f"{self.base}/points/delete", self.key(tenant), {"filter": flt}, wait="true"
            )
        )
        hit = {
            i for i in self.model.visible(tenant) if matches(flt, i, self.model.points[i].payload)
        }
        self._apply_delete(tenant, hit)
        self.check_unchanged()

    @rule(who=st.integers(0, N_TENANTS - 1))
    def revoke_key(self, who: int) -> None:
        tenant = self.tenants[who]
        old_key, key_id = self.keys[tenant]
        ok(self.call("DELETE", f"/admin/keys/{key_id}", self.admin))
        self.revoked.append(old_key)
        self.stats["key revoked"] += 1
        assert_denied(
            self.call(
                "POST", f"{self.base}/points/query", old_key, {"query": [0.5] * DIM, "limit": BIG}
            )
        )
        self.new_key(tenant)  # the tenant's points are the tenant's, not the key's

    @rule(data=st.data())
    def revoked_key_is_refused(self, data: st.DataObject) -> None:
        if not self.revoked:
            return
        key = data.draw(st.sampled_from(self.revoked))
        requests = [
            (
                "POST",
                f"{self.base}/points/query",
                {"query": [0.5] * DIM, "limit": BIG, "with_payload": True},
            ),
            ("POST", f"{self.base}/points", {"ids": ID_POOL, "with_payload": True}),
            ("POST", f"{self.base}/points/count", {"exact": True}),
            ("GET", f"{self.base}/points/{ID_POOL[0]}", None),
            ("PUT", f"{self.base}/points", {"points": [{"id": 999, "vector": [0.5] * DIM}]}),
            ("POST", f"{self.base}/points/delete", {"points": ID_POOL}),
        ]
        method, path, body = data.draw(st.sampled_from(requests))
        assert_denied(self.call(method, path, key, body))
        self.check_unchanged()
        self.stats["revoked key refused"] += 1
