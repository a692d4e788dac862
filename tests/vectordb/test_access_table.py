"""AccessTable against a dict model: ids in one range (not held) and scattered alike."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vectordb.tenancy.access_table import AccessTable
from vectordb.tenancy.tenant_store import location_versions

OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "remove", "grant", "revoke", "drop_tenant", "merge"]),
        st.integers(0, 40),
        st.integers(0, 5),
    ),
    max_size=60,
)


def _check(table: AccessTable, model: dict[int, tuple[int, int, set[int]]]) -> None:
    probe = np.arange(-2, 45, dtype=np.int64)
    for tenant in range(6):
        want = np.array([int(v) in model and tenant in model[int(v)][2] for v in probe])
        assert (table.member(probe, np.full(len(probe), tenant)) == want).all()
        locs = np.array([model[int(v)][0] if int(v) in model else 0 for v in probe])
        readable = table.readable(probe, location_versions(locs), tenant)
        assert (readable == want).all()
        # a copy of an earlier incarnation (another location's version) is never readable
        assert not table.readable(probe, location_versions(locs + 1), tenant).any()
        assert table.count(tenant) == sum(tenant in e[2] for e in model.values())
    # a batch's check: a tenant per record, each probe asked for every tenant at once
    owners = np.repeat(np.arange(6), len(probe))
    many = np.tile(probe, 6)
    locs = np.array([model[int(v)][0] if int(v) in model else 0 for v in many])
    want_all = [
        int(v) in model and t in model[int(v)][2] for v, t in zip(many, owners, strict=True)
    ]
    assert (table.readable_by(many, location_versions(locs), owners) == want_all).all()
    found, loc, leaf = table.lookup(probe)
    for v, f, lo, le in zip(probe.tolist(), found, loc, leaf, strict=True):
        assert f == (v in model)
        if f:
            assert (lo, le) == model[v][:2]
            assert set(table.get(v).tenants) == model[v][2]  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None)
@given(dense=st.booleans(), ops=OPS)
def test_access_table_matches_a_dict(dense: bool, ops: list[tuple[str, int, int]]) -> None:
    table = AccessTable()
    step = 1 if dense else 7
    ids = np.arange(0, 30 * step, step, dtype=np.int64)
    locs = ids * 3 + (1 << 33 if not dense else 0)  # scattered ids also get 64-bit locations
    model = {int(v): (int(lo), int(v) % 5, {int(v) % 4}) for v, lo in zip(ids, locs, strict=True)}
    table.load(ids, locs, ids % 5, np.ones(len(ids), np.int64), ids % 4)
    _check(table, model)
    for op, vid, tenant in ops:
        if op == "put":
            table.put(vid, vid * 11, vid % 3, (tenant,))
            model[vid] = (vid * 11, vid % 3, {tenant})
        elif op == "remove":
            assert (table.remove(vid) is not None) == (vid in model)
            model.pop(vid, None)
        elif op == "grant":
            assert table.add_pair(vid, tenant) == (vid in model and tenant not in model[vid][2])
            if vid in model:
                model[vid][2].add(tenant)
        elif op == "revoke":
            assert table.remove_pair(vid, tenant) == (vid in model and tenant in model[vid][2])
            if vid in model:
                model[vid][2].discard(tenant)
        elif op == "drop_tenant":
            dropped = sum(tenant in e[2] for e in model.values())
            assert table.remove_tenant(tenant) == dropped
            for entry in model.values():
                entry[2].discard(tenant)
        else:
            table.merge()
        _check(table, model)
    restored = AccessTable()
    restored.restore(table.snapshot())
    _check(restored, model)


def test_filtered_route_with_a_tenant_that_has_no_pair_yet(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tenant numbered by a grant of unknown ids holds no pair, and its number may lie past
    the count array: the filtered route answered IndexError for a batch holding it."""
    import asyncio

    from vectordb import IndexConfig, SearchParams, SpannIndex

    async def main() -> None:
        index = await SpannIndex.create(tmp_path / "idx", IndexConfig(dim=8, tenancy=True))
        vectors = np.random.default_rng(0).random((200, 8), np.float32)
        await index.build(None, vectors, tenants=[[1]] * 200)
        for i in range(20):
            assert await index.grant([10**6], f"nobody{i}") == 0
        params = SearchParams(tenant_route="filter")
        ids, _ = await index.search(vectors[:2], 3, params, tenant=[1, "nobody19"])
        assert (ids[0] >= 0).all() and (ids[1] == -1).all()
        assert index.count("nobody19") == 0
        await index.aclose()

    asyncio.run(main())
