"""vectordb.collections against a plain dict model: a hypothesis state machine interleaving
upserts (admin and tenants, new and overwritten points, int and UUID ids), deletes (by id and
by filter), grants, revokes, a keyword payload index, and reopening the catalog.

After every step, for the admin and every tenant: ``retrieve`` of every id ever used returns
exactly the points the model says it may read (with their payloads and vectors), ``count``
equals the model with and without a filter, ``scroll`` pages through exactly those in id
order, and an exact query equals brute force over what
the caller may read and the filter matches. Each non-exact query returns only such points.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from vectordb.collections import (
    Catalog,
    Collection,
    CollectionConfig,
    PointNotWritableError,
    parse_filter,
)

T = TypeVar("T")
DIM = 6
TENANTS = ["a", "b", "c"]
CALLERS: list[str | None] = [None, *TENANTS]
IDS: list[Any] = [*range(12), "00000000-0000-4000-8000-00000000000a", 2**62]
GROUPS = ["x", "y", "z"]
FILTERS: list[dict[str, Any] | None] = [
    None,
    {"must": [{"key": "g", "match": {"value": "x"}}]},
    {"must_not": [{"key": "n", "range": {"gte": 5}}]},
    {"should": [{"key": "g", "match": {"any": ["y", "z"]}}, {"key": "n", "range": {"lt": 2}}]},
]


@dataclass
class ModelPoint:
    vector: np.ndarray
    payload: dict[str, Any]
    owner: str | None
    tenants: list[str] = field(default_factory=list)


class CollectionMachine(RuleBasedStateMachine):
    distance = "Euclid"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="collections-model-"))
        self.loop = asyncio.new_event_loop()
        self.catalog: Catalog | None = None
        self.points: dict[Any, ModelPoint] = {}
        self.rng = np.random.default_rng(0)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @property
    def c(self) -> Collection:
        assert self.catalog is not None
        return self.catalog.get("m")

    def teardown(self) -> None:
        try:
            if self.catalog is not None:
                self._run(self.catalog.aclose())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _visible(self, caller: str | None, filt: dict[str, Any] | None = None) -> set[Any]:
        parsed = parse_filter(filt)
        return {
            pid
            for pid, p in self.points.items()
            if (caller is None or caller in p.tenants)
            and (parsed is None or parsed.matches(pid, p.payload))
        }

    # ---------------------------------------------------------------- rules
    @initialize(distance=st.sampled_from(["Euclid", "Cosine", "Dot"]))
    def open(self, distance: str) -> None:
        self.distance = distance

        async def main() -> Catalog:
            catalog = await Catalog.open(self.dir)
            await catalog.create("m", CollectionConfig(dim=DIM, distance=distance))
            return catalog

        self.catalog = self._run(main())

    @rule(
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=6, unique=True),
        caller=st.sampled_from(CALLERS),
        seed=st.integers(0, 2**16),
    )
    def upsert(self, ids: list[Any], caller: str | None, seed: int) -> None:
        rng = np.random.default_rng(seed)
        vectors = rng.normal(size=(len(ids), DIM)).astype(np.float32)
        payloads = [{"g": GROUPS[int(rng.integers(3))], "n": int(rng.integers(10))} for _ in ids]
        writable = all(
            caller is None or pid not in self.points or self.points[pid].owner == caller
            for pid in ids
        )
        if not writable:
            with pytest.raises(PointNotWritableError):
                self._run(self.c.upsert(ids, vectors, payloads, tenant=caller))
            return
        self._run(self.c.upsert(ids, vectors, payloads, tenant=caller))
        for pid, vector, payload in zip(ids, vectors, payloads, strict=True):
            if self.distance == "Cosine":
                vector = vector / np.linalg.norm(vector)
            before = self.points.get(pid)
            owner = before.owner if before else caller
            tenants = before.tenants if before else ([caller] if caller else [])
            self.points[pid] = ModelPoint(vector, payload, owner, list(tenants))

    @rule(ids=st.lists(st.sampled_from(IDS), max_size=5), caller=st.sampled_from(CALLERS))
    def delete(self, ids: list[Any], caller: str | None) -> None:
        expected = 0
        for pid in set(ids):
            p = self.points.get(pid)
            if p is None:
                continue
            if caller is None or p.owner == caller:
                del self.points[pid]
                expected += 1
            elif caller in p.tenants:
                p.tenants.remove(caller)
                expected += 1
        assert self._run(self.c.delete(ids, tenant=caller)) == expected

    @rule(filt=st.sampled_from(FILTERS[1:]), caller=st.sampled_from(CALLERS))
    def delete_where(self, filt: dict[str, Any], caller: str | None) -> None:
        victims = self._visible(caller, filt)
        for pid in victims:
            p = self.points[pid]
            if caller is None or p.owner == caller:
                del self.points[pid]
            else:
                p.tenants.remove(caller)
        got = self._run(self.c.delete_where(parse_filter(filt), tenant=caller))  # type: ignore[arg-type]
        assert got == len(victims)

    @rule(
        ids=st.lists(st.sampled_from(IDS), max_size=6),
        tenant=st.sampled_from(TENANTS),
        grant=st.booleans(),
    )
    def access(self, ids: list[Any], tenant: str, grant: bool) -> None:
        changed = 0
        for pid in set(ids):
            p = self.points.get(pid)
            if p is None or (tenant in p.tenants) == grant:
                continue
            changed += 1
            if grant:
                p.tenants.append(tenant)
            else:
                p.tenants.remove(tenant)
                p.owner = None if p.owner == tenant else p.owner
        call = self.c.grant if grant else self.c.revoke
        assert self._run(call(ids, tenant)) == changed

    @rule()
    def payload_index(self) -> None:
        self._run(self.c.create_payload_index("g"))

    @rule()
    def reopen(self) -> None:
        assert self.catalog is not None
        self._run(self.catalog.aclose())
        self.catalog = self._run(Catalog.open(self.dir))

    @rule(
        caller=st.sampled_from(CALLERS),
        filt=st.sampled_from(FILTERS),
        limit=st.integers(1, 8),
        seed=st.integers(0, 2**16),
    )
    def query(self, caller: str | None, filt: dict[str, Any] | None, limit: int, seed: int):
        query = np.random.default_rng(seed).normal(size=(2, DIM)).astype(np.float32)
        allowed = self._visible(caller, filt)
        parsed = parse_filter(filt)
        for exact in (False, True):
            rows = self._run(
                self.c.query(query, limit=limit, filter=parsed, tenant=caller, exact=exact)
            )
            for row, q in zip(rows, query, strict=True):
                got = [h.id for h in row]
                assert set(got) <= allowed, "a query returned a point its caller may not see"
                assert len(got) == len(set(got))
                for h in row:
                    assert h.payload == self.points[h.id].payload
                if exact:
                    assert got == self._brute_force(q, allowed, limit)

    def _brute_force(self, q: np.ndarray, allowed: set[Any], limit: int) -> list[Any]:
        ids = sorted(allowed, key=str)
        if not ids:
            return []
        vectors = np.stack([self.points[i].vector for i in ids])
        if self.distance == "Euclid":
            scores = -np.linalg.norm(vectors - q, axis=1)
        elif self.distance == "Cosine":
            scores = vectors @ (q / np.linalg.norm(q))
        else:
            scores = vectors @ q
        order = np.argsort(-scores, kind="stable")[:limit]
        return [ids[j] for j in order]

    # ---------------------------------------------------------------- checks
    @invariant()
    def matches_model(self) -> None:
        if self.catalog is None:
            return
        for caller in CALLERS:
            points = self._run(self.c.retrieve(IDS, tenant=caller, with_vector=True))
            seen = {p.id: p for p in points}
            assert set(seen) == self._visible(caller)
            for pid, point in seen.items():
                assert point.payload == self.points[pid].payload
                assert np.allclose(point.vector, self.points[pid].vector, atol=1e-5)
            for filt in FILTERS:
                got = self._run(self.c.count(parse_filter(filt), tenant=caller))
                assert got == len(self._visible(caller, filt)), (caller, filt)
                assert self._scrolled(caller, filt) == _id_order(self._visible(caller, filt))

    def _scrolled(self, caller: str | None, filt: dict[str, Any] | None) -> list[Any]:
        """Every page of ``scroll``, 3 points a page, followed to the end."""
        out: list[Any] = []
        offset = None
        while True:
            page, offset = self._run(
                self.c.scroll(limit=3, offset=offset, filter=parse_filter(filt), tenant=caller)
            )
            out += [p.id for p in page]
            if offset is None:
                return out
            assert len(page) == 3


def _id_order(ids: set[Any]) -> list[Any]:
    """Qdrant's order: integer ids ascending, then UUIDs (by their bytes)."""
    return sorted(ids, key=lambda i: (1, i) if isinstance(i, str) else (0, i))


TestCollectionModel = CollectionMachine.TestCase
TestCollectionModel.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
