"""The isolation state machine's state: its model, its keys, its helpers, its setup.

``IsolationState`` holds what one run of the machine knows (a fresh collection, the model of
its points) and what runs share (the tenants' keys: a key costs a slow KDF). The rules are in
``isolation_writes.py`` and ``isolation_machine.py``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize

from tests.server.isolation_model import DIM, ID_POOL, N_TENANTS, TAGS, TENANTS, Client, Model, ok
from tests.server.live_server import LiveServer


class IsolationState(RuleBasedStateMachine):
    """The state of one run: a fresh collection; the tenants' keys live across runs (a key
    costs a slow KDF)."""

    live: ClassVar[LiveServer]
    client: ClassVar[Client]
    runs: ClassVar[itertools.count[int]] = itertools.count()
    keys: ClassVar[dict[str, tuple[str, str]]] = {}  # tenant -> (key, key_id)
    stats: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.run = next(self.runs)
        self.collection = f"iso{self.run}"
        self.base = f"/collections/{self.collection}"
        self.tenants = TENANTS
        self.revoked: list[str] = []  # this run's (what a run draws must not depend on others)

    # -- helpers -------------------------------------------------------------------------------

    def call(self, method: str, path: str, key: str | None, body: Any = None, **params: Any):
        return self.client(method, path, key, body, **params)

    @property
    def admin(self) -> str:
        return self.live.admin_key

    def key(self, tenant: str) -> str:
        return self.keys[tenant][0]

    def new_key(self, tenant: str) -> None:
        made = ok(self.call("POST", "/admin/keys", self.admin, {"tenant": tenant}))
        IsolationState.keys[tenant] = (made["key"], made["key_id"])

    def snapshot(self) -> dict[int, dict[str, Any]]:
        """Every point as the admin sees it (the ground truth of existence and content)."""
        found = ok(
            self.call(
                "POST", f"{self.base}/points", self.admin, {"ids": ID_POOL, "with_payload": True}
            )
        )
        return {p["id"]: p["payload"] for p in found}

    def check_unchanged(self) -> None:
        assert self.snapshot() == {i: p.payload for i, p in self.model.points.items()}

    def payload(self, data: st.DataObject) -> dict[str, Any]:
        owner, tag, n = data.draw(
            st.tuples(
                st.sampled_from([*self.tenants, "admin"]), st.sampled_from(TAGS), st.integers(0, 9)
            )
        )
        # "owner" is a claim, not a right: the tenancy never reads payloads
        return {"owner": owner, "tag": tag, "n": n}

    # -- setup ---------------------------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        ok(
            self.call(
                "PUT", self.base, self.admin, {"vectors": {"size": DIM, "distance": "Euclid"}}
            )
        )
        for tenant in self.tenants:
            if tenant not in self.keys:
                self.new_key(tenant)
        # A start with points of every writer, so the first reads have something to leak.
        for who in range(N_TENANTS + 1):
            group = ID_POOL[who :: N_TENANTS + 1]
            self._upsert(
                who,
                data.draw(st.lists(st.sampled_from(group), min_size=1, max_size=4, unique=True)),
                data,
            )

    def teardown(self) -> None:
        self.call("DELETE", self.base, self.admin)
