"""Batched grants and revokes (issue 15): a grant of many ids is one log record; its copies wait
for the next checkpoint (Tenancy.settle_pending: one read of home copies a tenant, one write of
the new runs, shortlists pushed past the limit split with the new rows before anything is
appended), and so do the merges a revoke leaves behind.

- power cuts at every I/O batch of a run of large grants, revokes and checkpoints: the reopened
  index holds the acknowledged state, or that plus the call in flight whole, and a whole-tenant
  exact search equals the model's;
- searches while a large grant or revoke is in flight see every pair acknowledged before they
  started, and none the call in flight does not end with.

Both on an L2 index and on a cosine one (whose shortlists have compact twins, written in the
same calls: checked whole after every cut, and searched through while calls are in flight).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vectordb import tenancy_crash_writer as writer
from tests.vectordb.helpers import run_until_power_cut
from tests.vectordb.tenancy_check import ALL_TWINS, EXACT, Model, assert_index_matches
from vectordb import SpannIndex

TENANTS: list[Any] = [*writer.TENANTS, "never-granted"]
_IDS = np.random.default_rng(7).permutation(writer.BASE).astype(np.int64)

# (kind, *arguments); "checkpoint" settles the revokes' shortlists
OPS: list[tuple[Any, ...]] = [
    ("grant", _IDS[:150], "ops"),  # most of its shortlists split with the new rows
    ("revoke", _IDS[:130], "ops"),
    ("checkpoint",),
    ("grant", np.concatenate([_IDS[100:220], [10**9]]), 5),
    ("revoke", _IDS[:200], 5),
    ("grant", _IDS[50:120], "ops"),  # again, into runs that still hold revoked copies
    ("checkpoint",),
]


def _model(ops: list[tuple[Any, ...]]) -> Model:
    ids, vectors, rows = writer.base()
    model = Model()
    model.insert(ids.tolist(), vectors, rows)
    for op in ops:
        if op[0] != "checkpoint":
            model.apply(op)
    return model


async def _run_op(index: SpannIndex, op: tuple[Any, ...]) -> None:
    kind, *args = op
    await getattr(index, kind)(*args)


async def _run(directory: Path, cut_at: int) -> tuple[int, list[int]]:
    """OPS over an engine that loses power before its ``cut_at``-th batch: (acknowledged
    calls, the engine's batch count when each call began, and at the end)."""
    return await run_until_power_cut(directory, OPS, _run_op, cut_at, seed=cut_at)


async def _check(directory: Path, acked: int) -> None:
    before, after = _model(OPS[:acked]), _model(OPS[: acked + 1])
    ids = list(range(writer.BASE))
    async with await SpannIndex.open(directory) as index:
        got = {i: set(index.tenants_of(i)) for i in ids}
        which = [m for m in (before, after) if got == {i: m.tenants_of(i) for i in ids}]
        assert which, f"after {acked} acknowledged calls the index holds a part of the next"
        await assert_index_matches(index, which[-1], TENANTS, ids, f"after {acked} calls: ")


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_power_cut_in_large_grants_revokes_and_their_settling(tmp_path: Path, metric: str) -> None:
    async def main() -> None:
        dry = tmp_path / "dry"
        await writer.create(dry, metric)
        acked, starts = await _run(dry, 10**9)
        assert acked == len(OPS)
        await _check(dry, acked)
        # a point inside each call, and the first batch after each checkpoint: its settled
        # runs must be durable before the checkpoint names them
        rng = np.random.default_rng(3)
        inside = [int(rng.integers(a + 1, b + 1)) for a, b in itertools.pairwise(starts) if b > a]
        after = [starts[n + 1] + 1 for n, op in enumerate(OPS) if op[0] == "checkpoint"]
        points = sorted({*inside, *after})
        tried = []
        for cut_at in points:
            directory = tmp_path / f"cut{cut_at}"
            await writer.create(directory, metric)
            acked, _ = await _run(directory, int(cut_at))
            tried.append(acked)
            await _check(directory, acked)
        assert len(set(tried)) >= len(OPS) - 1, f"cuts fell inside too few calls: {tried}"

    asyncio.run(main())


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_searches_during_large_grants_and_revokes_see_every_acknowledged_pair(
    tmp_path: Path, metric: str
) -> None:
    async def main() -> None:
        await writer.create(tmp_path / "i", metric)
        model = _model([])
        queries = np.random.default_rng(2).normal(size=(3, writer.DIM)).astype(np.float32) * 4
        during = 0
        async with await SpannIndex.open(tmp_path / "i") as index:
            for op in OPS:
                if op[0] == "checkpoint":
                    await index.checkpoint()
                    continue
                tenant = op[2]
                before = model.readable(tenant)
                model.apply(op)
                after = model.readable(tenant)
                low, high = before & after, before | after
                call = asyncio.ensure_future(_run_op(index, op))
                while not call.done():
                    for params in (EXACT, ALL_TWINS) if metric != "l2" else (EXACT,):
                        found, _ = await index.search(queries, writer.BASE, params, tenant=tenant)
                        for row in found.tolist():
                            got = {i for i in row if i >= 0}
                            assert got <= high, f"{op[0]}: ids outside access: {got - high}"
                            assert low <= got, f"{op[0]}: acknowledged ids missing: {low - got}"
                    during += 1
                await call
                found, _ = await index.search(queries, writer.BASE, EXACT, tenant=tenant)
                assert all({i for i in row if i >= 0} == after for row in found.tolist())
        assert during >= 5, f"only {during} searches overlapped a call"

    asyncio.run(main())
