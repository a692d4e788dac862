"""Tenant isolation by example: keys refused without leaking, and each tenancy rule in order.

The random program of ``test_isolation_machine.py`` relies on the rules of
``isolation_model.py``; these scripted tests state each rule once, with the rarer cases the
program may not reach (a revoked owner, a re-used id, a tenant's admin requests), and check
that a missing, malformed or unknown key gets 401 with no data and no key text.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.server.isolation_model import BIG, DIM, Client, assert_denied, ok, vector_of
from tests.server.live_server import LiveServer


def test_keys_refused_without_leaking(live: LiveServer) -> None:
    """No key, a malformed key, an unknown key of the right form: 401, no data, no key text."""
    client = Client(live.url)
    try:
        ok(
            client(
                "PUT",
                "/collections/keys",
                live.admin_key,
                {"vectors": {"size": 2, "distance": "Dot"}},
            )
        )
        ok(
            client(
                "PUT",
                "/collections/keys/points",
                live.admin_key,
                {"points": [{"id": 1, "vector": [1, 0], "payload": {"s": "secret"}}]},
                wait="true",
            )
        )
        wrong = "tk_0123456789ab_" + "x" * 32
        for key in (None, "", "nonsense", wrong, live.admin_key + "x"):
            for method, path, body in (
                ("POST", "/collections/keys/points/query", {"query": [1, 0], "with_payload": True}),
                ("POST", "/collections/keys/points", {"ids": [1], "with_payload": True}),
                ("GET", "/collections/keys/points/1", None),
                ("POST", "/admin/keys", {"tenant": "x"}),
            ):
                response = client(method, path, key, body)
                assert response.status_code == 401, (key, path, response.status_code)
                assert "secret" not in response.text
                if key:
                    assert key not in response.text
                assert response.json()["status"]["error"]
        # Bearer works like api-key; a tenant key is no admin.
        made = ok(client("POST", "/admin/keys", live.admin_key, {"tenant": "k1"}))
        bearer = {"Authorization": f"Bearer {made['key']}"}
        response = client.http.post("/collections/keys/points", headers=bearer, json={"ids": [1]})
        assert ok(response) == []
        response = client.http.post("/admin/keys", headers=bearer, json={"tenant": "k2"})
        assert response.status_code == 403
        assert made["key"] not in response.text
    finally:
        client.http.close()


def test_tenancy_rules_by_example(live: LiveServer) -> None:
    """Each rule the model encodes, once, in order (what the random program relies on)."""
    client = Client(live.url)
    admin = live.admin_key
    base = "/collections/rules"

    def key_for(tenant: str) -> tuple[str, str]:
        made = ok(client("POST", "/admin/keys", admin, {"tenant": tenant}))
        return made["key"], made["key_id"]

    def put(key: str, *ids: int, tag: str = "x") -> httpx.Response:
        points = [{"id": i, "vector": vector_of(i), "payload": {"tag": tag, "i": i}} for i in ids]
        return client("PUT", f"{base}/points", key, {"points": points}, wait="true")

    def seen(key: str, flt: dict[str, Any] | None = None) -> dict[str, Any]:
        """What ``key`` sees: query hits, count, and (without a filter) retrieve of ids 1..8."""
        query = {"query": vector_of(0), "limit": BIG, **({"filter": flt} if flt else {})}
        count = {"exact": True, **({"filter": flt} if flt else {})}
        hits = ok(client("POST", f"{base}/points/query", key, query))["points"]
        got = {
            "query": sorted(h["id"] for h in hits),
            "count": ok(client("POST", f"{base}/points/count", key, count))["count"],
        }
        if flt is None:
            found = ok(client("POST", f"{base}/points", key, {"ids": list(range(1, 9))}))
            got["retrieve"] = sorted(p["id"] for p in found)
        return got

    def view(*ids: int, filtered: bool = False) -> dict[str, Any]:
        want: dict[str, Any] = {"query": sorted(ids), "count": len(ids)}
        if not filtered:
            want["retrieve"] = sorted(ids)
        return want

    try:
        ok(client("PUT", base, admin, {"vectors": {"size": DIM, "distance": "Euclid"}}))
        a, _ = key_for("rules-a")
        b, b_id = key_for("rules-b")
        ok(put(a, 1, 2, tag="a"))
        ok(put(b, 3, tag="b"))
        ok(put(admin, 4, tag="admin"))
        assert seen(admin) == view(1, 2, 3, 4)
        assert seen(a) == view(1, 2)
        assert seen(b) == view(3)
        # no filter widens a view
        widen = {"should": [{"key": "tag", "match": {"any": ["a", "admin"]}}]}
        assert seen(b, widen) == view(filtered=True)
        assert seen(b, {"must": [{"has_id": [1, 2, 4]}]}) == view(filtered=True)
        assert seen(b, {"must_not": [{"has_id": [3]}]}) == view(filtered=True)
        # another tenant's point reads as no point at all
        assert client("GET", f"{base}/points/1", b).status_code == 404
        assert client("GET", f"{base}/points/99", b).status_code == 404
        # writing another's point is refused, and the refusal changes nothing
        assert put(b, 1, 5, tag="b").status_code == 403
        assert put(b, 4).status_code == 403
        assert seen(admin) == view(1, 2, 3, 4)
        assert ok(client("GET", f"{base}/points/1", a))["payload"] == {"tag": "a", "i": 1}
        # a grant lets b read 1 but not write it
        ok(client("POST", f"{base}/points/grant", admin, {"tenant": "rules-b", "points": [1, 77]}))
        assert seen(b) == view(1, 3)
        assert put(b, 1).status_code == 403
        # b deleting a granted point drops only b's grant
        ok(client("POST", f"{base}/points/delete", b, {"points": [1, 2, 4]}, wait="true"))
        assert seen(b) == view(3)
        assert seen(a) == view(1, 2)
        assert seen(admin) == view(1, 2, 3, 4)
        # revoking the owner leaves the point to the admin: a can neither read nor write it
        ok(client("POST", f"{base}/points/revoke", admin, {"tenant": "rules-a", "points": [2]}))
        assert seen(a) == view(1)
        assert put(a, 2).status_code == 403
        # a delete by a filter that matches everything reaches only the caller's view
        everything = {"should": [{"has_id": list(range(1, 9))}, {"is_empty": {"key": "none"}}]}
        ok(client("POST", f"{base}/points/delete", a, {"filter": everything}, wait="true"))
        assert seen(a) == view()
        assert seen(admin) == view(2, 3, 4)
        # a re-used id of a deleted point is a new point: no old grant comes back with it
        ok(client("POST", f"{base}/points/grant", admin, {"tenant": "rules-b", "points": [2]}))
        ok(client("POST", f"{base}/points/delete", admin, {"points": [2]}, wait="true"))
        ok(put(a, 2, tag="a2"))
        assert seen(b) == view(3)
        assert seen(a) == view(2)
        # tenants cannot grant, make keys, or change collections
        for method, path, body in (
            ("POST", f"{base}/points/grant", {"tenant": "rules-b", "points": [2]}),
            ("POST", "/admin/keys", {"tenant": "rules-b"}),
            ("PUT", f"{base}/index", {"field_name": "tag", "field_schema": "keyword"}),
            ("DELETE", base, None),
            ("PUT", "/collections/other", {"vectors": {"size": 2, "distance": "Dot"}}),
        ):
            assert client(method, path, b, body).status_code == 403, (method, path)
        assert seen(b) == view(3)
        # a revoked key is refused at once; the tenant's new key sees the tenant's points
        ok(client("DELETE", f"/admin/keys/{b_id}", admin))
        for method, path, body in (
            ("POST", f"{base}/points", {"ids": [3]}),
            ("POST", f"{base}/points/query", {"query": vector_of(0)}),
            ("POST", f"{base}/points/count", {}),
            ("PUT", f"{base}/points", {"points": [{"id": 6, "vector": vector_of(6)}]}),
        ):
            assert_denied(client(method, path, b, body))
        b2, _ = key_for("rules-b")
        assert seen(b2) == view(3)
        assert seen(admin) == view(2, 3, 4)
    finally:
        client("DELETE", base, admin)
        client.http.close()
