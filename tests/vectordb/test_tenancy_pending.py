"""Deferred grants (issue 15): a grant is logged and in the access table when it returns; the
copies into the tenant's shortlists wait for the next checkpoint (vectordb.tenancy.pending_grants)
or a bound. Searches must find every acknowledged grant before it is settled, during the
checkpoint that settles it, after a power cut (the log replays it) and after a reopen; revokes,
deletes and tenant deletes of pending pairs must leave nothing behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vectordb.tenancy.tenancy as tenancy_module
from tests.vectordb import tenancy_crash_writer as writer
from tests.vectordb.tenancy_check import EXACT, Model, assert_index_matches, small_config
from tiers.io import IORuntime, ThreadEngine
from tiers.testing import FaultyEngine
from vectordb import SearchParams, SpannIndex
from vectordb.tenancy.pending_grants import PendingGrants

TENANTS: list[Any] = [*writer.TENANTS, "fresh", "never-granted"]
IDS = list(range(writer.BASE))
_ORDER = np.random.default_rng(11).permutation(writer.BASE).astype(np.int64)
# grants of many pairs (some already granted, one unknown id), then changes to pending pairs
GRANTS: list[tuple[Any, ...]] = [
    ("grant", _ORDER[:120], "ops"),
    ("grant", np.concatenate([_ORDER[60:200], [10**9]]), "fresh"),
    ("grant", _ORDER[150:260], 5),
]
CHANGES: list[tuple[Any, ...]] = [
    ("revoke", _ORDER[:40], "ops"),  # pending pairs: out of the pending set, not a shortlist
    ("delete", _ORDER[100:110]),  # deleted ids drop their pending pairs
    ("grant", _ORDER[:20], "ops"),  # pending again
    ("delete_tenant", 5),
]


async def _create(directory: Path) -> None:
    """The crash writer's index, but checkpointed only when a test asks (its own config
    checkpoints every few calls, which would settle the grants under test)."""
    ids, vectors, rows = writer.base()
    async with await SpannIndex.create(directory, small_config(posting_limit=32)) as index:
        await index.build(ids, vectors, tenants=rows)


def _model(ops: list[tuple[Any, ...]]) -> Model:
    ids, vectors, rows = writer.base()
    model = Model()
    model.insert(ids.tolist(), vectors, rows)
    for op in ops:
        model.apply(op)
    return model


async def _apply(index: SpannIndex, ops: list[tuple[Any, ...]]) -> None:
    for kind, *args in ops:
        await getattr(index, kind)(*args)


def test_acknowledged_grants_are_searched_before_settling(tmp_path: Path) -> None:
    async def main() -> None:
        await _create(tmp_path / "i")
        vectors = writer.base()[1]
        async with await SpannIndex.open(tmp_path / "i") as index:
            shortlists = index.stats()["shortlists"]
            await _apply(index, GRANTS)
            assert index.stats()["pending_grants"] > 300
            assert index.stats()["shortlists"] == shortlists, "grants copied before settling"
            await assert_index_matches(index, _model(GRANTS), TENANTS, IDS, "pending: ")
            # a default (not exact) search finds a pending vector by itself
            probe = _ORDER[150:160]
            found, _ = await index.search(vectors[probe], 1, SearchParams(), tenant="fresh")
            assert found[:, 0].tolist() == probe.tolist()
            await _apply(index, CHANGES)
            model = _model(GRANTS + CHANGES)
            await assert_index_matches(index, model, TENANTS, IDS, "changed: ")
            await index.checkpoint()
            assert index.stats()["pending_grants"] == 0
            assert index.stats()["shortlists"] > shortlists
            await assert_index_matches(index, model, TENANTS, IDS, "settled: ")

    asyncio.run(main())


def test_pending_grants_survive_a_power_cut_and_a_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        await _create(tmp_path / "i")
        engine = FaultyEngine(ThreadEngine(4), seed=5)
        runtime = IORuntime(engine=lambda *_: engine)
        index = await SpannIndex.open(tmp_path / "i", runtime=runtime)
        await _apply(index, GRANTS + CHANGES)
        assert index.stats()["pending_grants"] > 0
        await engine.power_cut("random")  # unsynced pages lost at random; the log is synced
        await index.aclose()
        await engine.aclose()
        model = _model(GRANTS + CHANGES)
        async with await SpannIndex.open(tmp_path / "i") as index:
            assert index.stats()["pending_grants"] > 0, "the log's grants are pending again"
            await assert_index_matches(index, model, TENANTS, IDS, "after the cut: ")
        async with await SpannIndex.open(tmp_path / "i") as index:  # closing checkpointed
            assert index.stats()["pending_grants"] == 0
            await assert_index_matches(index, model, TENANTS, IDS, "after a reopen: ")

    asyncio.run(main())


def test_searches_during_a_settling_checkpoint_see_every_grant(tmp_path: Path) -> None:
    async def main() -> None:
        await _create(tmp_path / "i")
        model = _model(GRANTS)
        queries = np.random.default_rng(2).normal(size=(3, writer.DIM)).astype(np.float32) * 4
        during = 0
        async with await SpannIndex.open(tmp_path / "i") as index:
            await _apply(index, GRANTS)
            settling = asyncio.ensure_future(index.checkpoint())
            while not settling.done() or not during:
                for tenant in ("ops", "fresh", 5):
                    found, _ = await index.search(queries, writer.BASE, EXACT, tenant=tenant)
                    for row in found.tolist():
                        assert {i for i in row if i >= 0} == model.readable(tenant), tenant
                during += 1
            await settling
            assert index.stats()["pending_grants"] == 0
        assert during >= 2, f"only {during} rounds of searches overlapped the checkpoint"

    asyncio.run(main())


def test_a_tenant_past_its_bound_is_settled_by_the_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tenancy_module, "PENDING_TENANT_PAIRS", 50)

    async def main() -> None:
        await _create(tmp_path / "i")
        async with await SpannIndex.open(tmp_path / "i") as index:
            await index.grant(_ORDER[:40], "fresh")
            assert index.stats()["pending_grants"] == 40
            await index.grant(_ORDER[40:60], "fresh")  # 60 > 50: settled in the call
            await index.grant(_ORDER[:30], "other")
            assert index.stats()["pending_grants"] == 30
            model = _model([("grant", _ORDER[:60], "fresh"), ("grant", _ORDER[:30], "other")])
            await assert_index_matches(index, model, ["fresh", "other"], IDS, "bounded: ")

    asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove", "pop", "snapshot"]),
            st.integers(0, 3),
            st.lists(st.integers(0, 40), max_size=12),
        ),
        max_size=30,
    )
)
def test_pending_grants_against_a_set_model(steps: list[tuple[str, int, list[int]]]) -> None:
    pending, model = PendingGrants(), dict[int, set[int]]()
    for kind, tenant, ids in steps:
        held = model.setdefault(tenant, set())
        if kind == "add":
            fresh = sorted(set(ids) - held)
            pending.add(tenant, np.array(fresh, np.int64))
            held.update(fresh)
        elif kind == "remove":
            hit = pending.remove(tenant, np.array(sorted(set(ids)), np.int64))
            assert hit.tolist() == [i in held for i in sorted(set(ids))]
            held.difference_update(ids)
        elif kind == "pop":
            assert pending.pop(tenant).tolist() == sorted(held)
            held.clear()
        else:
            again = PendingGrants()
            again.restore(pending.snapshot())
            pending = again
        for t, want in model.items():
            assert pending.ids(t).tolist() == sorted(want)
            assert (t in pending) == bool(want)
        assert pending.pairs == sum(len(v) for v in model.values())
