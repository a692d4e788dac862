"""Tenant searches running while another task grants, revokes, inserts with tenants, deletes
and drops tenants (issue 15): no result is ever outside its tenant's access. A search may see
any state between its start and its end, so a result must be readable by its tenant in at
least one state from the last acknowledged one at its start (or the one then in flight) to the
one at its end. Small concurrent searches of different tenants are gathered into shared batches
(vectordb.gather): each must still get its own tenant's answer."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vectordb.helpers import clustered
from tests.vectordb.tenancy_check import (
    EXACT,
    Model,
    assert_exact,
    assert_index_matches,
    assert_no_leaks,
    small_config,
)
from vectordb import SearchParams, SpannIndex
from vectordb.metric import Metric

DIM = 8
N = 600
TENANTS: list[Any] = [0, 1, 2, 5, "5", "red", "blue", 10**12, "x"]
CONFIG = small_config()


def _base(n: int = N) -> tuple[np.ndarray, np.ndarray, list[list[Any]]]:
    rng = np.random.default_rng(1)
    weights = np.array([0.3, 0.1, 0.05, 0.05, 0.05, 0.03, 0.02, 0.01, 0.0])
    rows = [[TENANTS[j] for j in np.flatnonzero(rng.random(len(TENANTS)) < weights)]
            for _ in range(n)]  # fmt: skip
    return np.arange(n, dtype=np.int64), clustered(n, DIM, seed=1, clusters=8), rows


class History:
    """Every access state the writer has passed through or is about to reach: states[v] is the
    tenant -> readable ids map after v operations (the last one may still be in flight)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.states = [model.snapshot()]
        self.in_flight = False  # whether states[-1] is an operation not yet acknowledged

    def start(self) -> int:
        """The first state a search starting now may see: the last acknowledged one."""
        return len(self.states) - 1 - self.in_flight

    def end(self) -> int:
        """The last state a search ending now may see (the one in flight, if any)."""
        return len(self.states) - 1

    def allowed(self, start: int, end: int) -> Any:
        """A tenant's ids readable in some state from ``start`` to ``end``."""
        states = self.states[start : end + 1]

        def of(tenant: Any) -> set[int]:
            return set().union(*(s.get(tenant, frozenset()) for s in states))

        return of


async def _writer(
    index: SpannIndex,
    history: History,
    ops: int,
    done: asyncio.Event,
    inserts_first: int = 0,
    seed: int = 7,
) -> None:
    """``ops`` random changes (the first ``inserts_first`` of them inserts), each recorded in
    ``history`` before it is made."""
    rng = np.random.default_rng(seed)
    model = history.model
    next_id = 10_000
    try:
        for step in range(ops):
            tenant = TENANTS[int(rng.integers(len(TENANTS)))]
            live = sorted(model.vectors)
            roll = 0.8 if step < inserts_first or len(live) < 10 else rng.random()
            if roll < 0.4:
                ids = rng.choice(live, int(rng.integers(1, 40)), replace=False)
                op: tuple[Any, ...] = ("grant", ids, tenant)
            elif roll < 0.75:
                mine = sorted(model.readable(tenant)) or live
                ids = rng.choice(mine, min(len(mine), int(rng.integers(1, 40))), replace=False)
                op = ("revoke", ids, tenant)
            elif roll < 0.85:
                n = int(rng.integers(1, 10))
                vectors = clustered(n, DIM, seed=step, clusters=8)
                rows = [[tenant, TENANTS[int(rng.integers(len(TENANTS)))]] for _ in range(n)]
                op = ("insert", np.arange(next_id, next_id + n), vectors, rows)
                next_id += n
            elif roll < 0.95:
                op = ("delete", rng.choice(live, 5, replace=False))
            else:
                op = ("delete_tenant", tenant)
            pending = model.copy()
            pending.apply(op)
            history.states.append(pending.snapshot())
            history.in_flight = True
            kind, *args = op
            if kind == "insert":
                await index.insert(args[0], args[1], tenants=args[2])
            else:
                await getattr(index, kind)(*args)
            model.apply(op)
            history.in_flight = False
            if step == ops // 2:
                await index.checkpoint()  # while searches run
            if step % 3 == 0:
                await asyncio.sleep(0)
    finally:
        done.set()


async def _reader(
    index: SpannIndex, history: History, done: asyncio.Event, seed: int, batch: int
) -> tuple[int, int]:
    """Searches until the writer is done; returns (searches, searches that saw a change)."""
    rng = np.random.default_rng(seed)
    searches = overlapped = 0
    params = [None, SearchParams(tenant_candidates=4), EXACT]
    while not done.is_set():
        n = int(rng.integers(1, batch + 1))
        tenants = [TENANTS[int(j)] for j in rng.integers(len(TENANTS), size=n)]
        queries = clustered(n, DIM, seed=int(rng.integers(1 << 30)), clusters=8)
        start = history.start()
        found, _ = await index.search(
            queries, int(rng.integers(1, 15)), params[searches % 3], tenant=tenants
        )
        end = history.end()
        assert_no_leaks(found, tenants, history.allowed(start, end), f"states {start}-{end}: ")
        searches += 1
        overlapped += start != end
    return searches, overlapped


@pytest.mark.parametrize("young", [False, True], ids=["built", "young"])
def test_searches_during_grants_and_revokes_never_leak(tmp_path: Path, young: bool) -> None:
    """``young``: built from 4 vectors with tree leaves of 16, so the tenant tree is trained
    again (every shortlist placed anew) while searches run."""

    async def main() -> None:
        ids, vectors, rows = _base(4 if young else N)
        model = Model()
        model.insert(ids.tolist(), vectors, rows)
        config = dataclasses.replace(CONFIG, tenant_leaf_size=16) if young else CONFIG
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(ids, vectors, tenants=rows)
            history = History(model)
            done = asyncio.Event()
            readers = [
                asyncio.create_task(_reader(index, history, done, seed, batch))
                for seed, batch in enumerate([1, 1, 1, 1, 2, 8, 40])
            ]
            await _writer(index, history, 150, done, inserts_first=15 if young else 0)
            counts = await asyncio.gather(*readers)
            assert sum(s for s, _ in counts) > 100, counts
            assert sum(o for _, o in counts) > 20, f"too few searches overlapped a write {counts}"
            every = sorted(set(model.vectors) | set(ids.tolist()))
            await assert_index_matches(index, model, TENANTS, every, "after the run: ")
            if young:
                assert index.stats()["tenant_tree_nodes"] > 1, "the tree was never trained"

    asyncio.run(main())


def test_gathered_single_searches_of_different_tenants_get_their_own_answers(
    tmp_path: Path,
) -> None:
    """Dozens of one-query searches at once, each for another tenant (the gatherer batches
    them): each equals brute force over its own tenant."""

    async def main() -> None:
        ids, vectors, rows = _base()
        model = Model()
        model.insert(ids.tolist(), vectors, rows)
        queries = clustered(64, DIM, seed=3, clusters=8)
        tenants = [TENANTS[q % len(TENANTS)] for q in range(64)]
        async with await SpannIndex.create(tmp_path / "i", CONFIG) as index:
            await index.build(ids, vectors, tenants=rows)
            for params in (EXACT, None):
                before = index.stats()["gathered_queries"]
                results = await asyncio.gather(
                    *(index.search(queries[q : q + 1], 7, params, tenant=tenants[q])
                      for q in range(64))
                )  # fmt: skip
                assert index.stats()["gathered_queries"] > before, "nothing was gathered"
                found = np.concatenate([r.ids for r in results])
                assert_no_leaks(found, tenants, model.readable)
                if params is EXACT:
                    scores = np.concatenate([r.scores for r in results])
                    assert_exact(Metric.L2, model, queries, 7, tenants, (found, scores))

    asyncio.run(main())
