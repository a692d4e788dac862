"""Multi-tenant SpannIndex (issue 15) against a plain dict model: a hypothesis state machine
interleaving insert (with tenants per row, both row forms), delete, grant, revoke, delete_tenant,
checkpoint, reopen, power cut (FaultyEngine; the reopen replays the log) and search, with
shortlists of 2-4 ids and tree nodes of 2-4 points (or 16, and a build of a few vectors, so the
tree is trained again as inserts arrive) so that shortlists split and merge all the time.

After every step: ``count`` and ``tenants_of`` equal the model for every tenant and id ever used,
and a whole-tenant exact search returns exactly the tenant's ids. Each search step checks that no
result is outside its tenant's access (default params and exact), and that an exact search
(``tenant_candidates=0``) equals brute force over the tenant's live vectors. Tenants are ints
(Python and numpy) and strs, 5 and "5" among them; a tenant with nothing gets all -1.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.vectordb.helpers import clustered
from tests.vectordb.tenancy_check import (
    EXACT,
    EXACT_ROUTES,
    Model,
    assert_exact,
    assert_index_matches,
    assert_no_leaks,
)
from tiers.io import IORuntime, ThreadEngine
from tiers.testing.faulty_engine import FaultyEngine
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.metric import Metric

T = TypeVar("T")
DIM = 8
# Zipf-like: tenant 0 reads ~30% of rows (above any selectivity threshold), the rest few
TENANTS: list[Any] = [0, 1, 5, "5", "alice", 7, 10**12, "租户", "b"]
WEIGHTS = np.array([0.30, 0.12, 0.08, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02])
NOBODY: list[Any] = ["nobody", 424242]  # never granted anything
_TENANT = st.sampled_from(TENANTS)


def _rows(rng: np.random.Generator, n: int, form: str) -> Any:
    """Tenants of ``n`` rows (some rows none, some several), in one of the contract's forms."""
    hits = rng.random((n, len(TENANTS))) < WEIGHTS
    rows = [[TENANTS[j] for j in np.flatnonzero(hit)] for hit in hits]
    if form == "numpy":  # numpy ints where a tenant is an int
        return [[np.int64(t) if isinstance(t, int) else t for t in row] for row in rows]
    if form == "csr":
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return (indptr, [t for row in rows for t in row])
    if form == "csr-int":  # CSR with a numpy array of ints: int tenants only
        rows = [[t for t in row if isinstance(t, int)] for row in rows]
        indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return (indptr, np.array([t for row in rows for t in row], np.int64))
    return rows


class TenancyMachine(RuleBasedStateMachine):
    metric = Metric.L2
    config_args: dict[str, Any] = {}

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tenancy-model-"))
        self.loop = asyncio.new_event_loop()
        # every engine can lose power (the power_cut rule); a reopen makes a fresh one
        self.engine: FaultyEngine | None = None
        self.runtime = IORuntime(engine=lambda *_: self._new_engine())
        self.index: SpannIndex | None = None
        self.model = Model()
        self.used: set[int] = set()  # every id ever inserted (live or deleted)
        self.next_id = 0
        self.step = 0
        self.counted = {"shortlist_splits": 0, "shortlist_merges": 0}

    def _count(self) -> None:
        """Add up the index's split and merge counters (a reopen starts them again)."""
        stats = self.idx.stats()
        for key in self.counted:
            self.counted[key] += int(stats.get(key, 0))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _new_engine(self) -> FaultyEngine:
        self.engine = FaultyEngine(ThreadEngine(4), seed=self.next_id)
        return self.engine

    def teardown(self) -> None:
        try:
            if self.index is not None:
                self._count()
                for key, n in self.counted.items():  # --hypothesis-show-statistics shows them
                    event(f"{key} > 0: {n > 0}")
                self._run(self.index.aclose())
        finally:
            self.runtime.close()
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def idx(self) -> SpannIndex:
        assert self.index is not None
        return self.index

    def _what(self) -> str:
        return f"step {self.step}: "

    # ---------------------------------------------------------------- rules
    @initialize(
        # a few vectors leave the tree a root until inserts reach two leaves (then it is
        # trained again and every shortlist placed again)
        n=st.one_of(st.integers(40, 120), st.integers(2, 12)),
        seed=st.integers(0, 2**16),
        tau=st.integers(2, 4),
        leaf=st.sampled_from([2, 3, 4, 16]),
        branching=st.integers(2, 4),
        form=st.sampled_from(["lists", "csr", "numpy"]),
        wal=st.sampled_from([64 << 20, 4096]),  # 4 KiB: checkpoints in the middle of changes
    )
    def build(
        self, n: int, seed: int, tau: int, leaf: int, branching: int, form: str, wal: int
    ) -> None:
        config = IndexConfig(
            dim=DIM,
            metric=self.metric.value,
            posting_limit=16,
            merge_threshold=3,
            reassign_neighbours=8,
            tenancy=True,
            shortlist_limit=tau,
            tenant_leaf_size=leaf,
            tenant_tree_branching=branching,
            checkpoint_wal_bytes=wal,
            **self.config_args,
        )
        rng = np.random.default_rng(seed)
        vectors = clustered(n, DIM, seed=seed, clusters=6)
        rows = _rows(rng, n, form)
        ids = np.arange(n, dtype=np.int64)

        async def main() -> SpannIndex:
            index = await SpannIndex.create(self.dir / "i", config, runtime=self.runtime)
            await index.build(ids, vectors, tenants=rows)
            return index

        self.index = self._run(main())
        self.model.insert(ids.tolist(), vectors, rows)
        self.used.update(ids.tolist())
        self.next_id = n

    @rule(
        n=st.integers(1, 25),
        seed=st.integers(0, 2**16),
        reuse=st.booleans(),
        form=st.sampled_from(["lists", "csr", "csr-int", "numpy"]),
    )
    def insert(self, n: int, seed: int, reuse: bool, form: str) -> None:
        rng = np.random.default_rng(seed)
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        deleted = sorted(self.used - set(self.model.vectors))
        if reuse and deleted:  # a deleted id comes back, with none of its old tenants
            ids[0] = int(rng.choice(deleted))
        # near existing vectors sometimes, so a tenant's dense region grows deeper
        vectors = clustered(n, DIM, seed=seed, clusters=6)
        rows = _rows(rng, n, form)
        self._run(self.idx.insert(np.array(ids, np.int64), vectors, tenants=rows))
        self.model.insert(ids, vectors, rows)
        self.used.update(ids)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        live = sorted(self.model.vectors)
        victims = (
            data.draw(st.lists(st.sampled_from(live), max_size=15, unique=True)) if live else []
        )
        victims.append(10**9)  # unknown ids are ignored
        assert self._run(self.idx.delete(np.array(victims, np.int64))) == self.model.delete(victims)

    def _pick(self, data: st.DataObject, tenant: Any, granting: bool) -> list[int]:
        """Ids for a grant or revoke: mostly live, some already (not) granted, some deleted or
        unknown; sometimes a whole neighbourhood, so one region of a tenant grows deep."""
        live = sorted(self.model.vectors)
        if not live:
            return [10**9]
        if data.draw(st.booleans()):
            centre = self.model.vectors[data.draw(st.sampled_from(live))]
            vectors = np.stack([self.model.vectors[i] for i in live])
            near = np.argsort(((vectors - centre) ** 2).sum(1))[: data.draw(st.integers(1, 30))]
            ids = [live[j] for j in near]
        else:
            pool = live if granting else sorted(self.model.readable(tenant)) or live
            ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=20, unique=True))
        extra = [*sorted(self.used - set(self.model.vectors))[:2], 10**9 + 7]
        return ids + data.draw(st.lists(st.sampled_from(extra), max_size=2, unique=True))

    @rule(tenant=_TENANT, data=st.data(), as_list=st.booleans())
    def grant(self, tenant: Any, data: st.DataObject, as_list: bool) -> None:
        ids = self._pick(data, tenant, granting=True)
        arg = ids if as_list else np.array(ids, np.int64)
        got = self._run(self.idx.grant(arg, tenant))
        assert got == self.model.grant(ids, tenant), f"grant({tenant!r}) returned {got}"

    @rule(tenant=_TENANT, data=st.data())
    def revoke(self, tenant: Any, data: st.DataObject) -> None:
        ids = self._pick(data, tenant, granting=False)
        got = self._run(self.idx.revoke(np.array(ids, np.int64), tenant))
        assert got == self.model.revoke(ids, tenant), f"revoke({tenant!r}) returned {got}"

    @rule(tenant=_TENANT)
    def delete_tenant(self, tenant: Any) -> None:
        got = self._run(self.idx.delete_tenant(tenant))
        assert got == self.model.delete_tenant(tenant), f"delete_tenant({tenant!r}) -> {got}"
        assert self.idx.count(tenant) == 0

    @rule()
    def checkpoint(self) -> None:
        self._run(self.idx.checkpoint())

    @rule()
    def reopen(self) -> None:
        self._count()
        self._run(self.idx.aclose())
        self.index = None
        self.index = self._run(SpannIndex.open(self.dir / "i", runtime=self.runtime))
        assert self.idx.config.tenancy is True

    @rule(keep=st.sampled_from(["none", "random"]))
    def power_cut(self, keep: Any) -> None:
        """Power fails (writes not yet synced lost, or some of them kept) and the index opens
        again from its checkpoint and log: every acknowledged change is there."""
        self._count()
        assert self.engine is not None
        self._run(self.engine.power_cut(keep))
        event("power cut")
        self._run(self.idx.aclose())
        self.index = None
        self.index = self._run(SpannIndex.open(self.dir / "i", runtime=self.runtime))

    @rule(
        seed=st.integers(0, 2**16),
        k=st.integers(1, 12),
        tenants=st.lists(st.sampled_from(TENANTS + NOBODY), min_size=1, max_size=8),
        one=st.booleans(),
    )
    def search(self, seed: int, k: int, tenants: list[Any], one: bool) -> None:
        """Random queries and copies of the tenants' own vectors; one tenant for the batch,
        or one per query."""
        rng = np.random.default_rng(seed)
        queries = list(clustered(len(tenants), DIM, seed=seed, clusters=6))
        for q, t in enumerate(tenants):
            mine = sorted(self.model.readable(t))
            if mine and rng.random() < 0.5:
                queries[q] = self.model.vectors[int(rng.choice(mine))]
        queries_arr = np.stack(queries).astype(np.float32)
        tenant: Any = tenants[0] if one else tenants
        for route, params in zip(("auto", "tree", "filter"), EXACT_ROUTES, strict=True):
            exact = self._run(self.idx.search(queries_arr, k, params, tenant=tenant))
            what = f"{self._what()}exact {route}: "
            assert_exact(self.metric, self.model, queries_arr, k, tenant, exact, what)
        what = self._what()
        for params in (
            None,
            SearchParams(tenant_candidates=3),
            SearchParams(tenant_route="tree"),
            SearchParams(tenant_route="filter", max_postings=1),
        ):
            found, _ = self._run(self.idx.search(queries_arr, k, params, tenant=tenant))
            tenant_list = [tenant] * len(queries_arr) if one else tenants
            assert_no_leaks(found, tenant_list, self.model.readable, what)
            assert found.shape == exact.ids.shape

    # ---------------------------------------------------------------- invariants
    @invariant()
    def agrees(self) -> None:
        if self.index is None:
            return
        self.step += 1
        tenants = [*TENANTS, *NOBODY]
        ids = [*sorted(self.used), 10**9]
        self._run(assert_index_matches(self.idx, self.model, tenants, ids, self._what()))
        assert self.idx.stats()["n_vectors"] == len(self.model.vectors)
        found, _ = self._run(
            self.idx.search(np.ones((2, DIM), np.float32), 5, EXACT, tenant=NOBODY)
        )
        assert (found == -1).all(), f"{self._what()}a tenant with nothing got {found}"


class CosineTenancyMachine(TenancyMachine):
    metric = Metric.COSINE


_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestTenancyL2 = TenancyMachine.TestCase
TestTenancyL2.settings = _SETTINGS
TestTenancyCosine = CosineTenancyMachine.TestCase
TestTenancyCosine.settings = settings(_SETTINGS, max_examples=20)
