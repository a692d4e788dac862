"""The tenancy API of SpannIndex (issue 15; /work/notes/tenancy_api.md): errors, edge cases,
reopen. Tenant calls on an index without tenancy are IndexConfigError; a bad tenant id is
InvalidTenantError (a ValueError) with nothing written; grants of unknown or deleted ids are
ignored; delete_tenant leaves nothing; 5 and "5" are two tenants; everything survives a reopen
(from the checkpoint and from the log)."""

from __future__ import annotations

import asyncio
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
from vectordb import IndexConfig, IndexConfigError, SearchParams, SpannIndex
from vectordb.errors import InvalidArgumentError
from vectordb.metric import Metric

DIM = 8


def _config(**extra: Any) -> IndexConfig:
    defaults = dict(
        posting_limit=16, shortlist_limit=2, tenant_leaf_size=2, tenant_tree_branching=2
    )
    return small_config(**{**defaults, **extra})


async def _built(directory: Path, n: int = 200, rows: Any = None, **extra: Any) -> SpannIndex:
    index = await SpannIndex.create(directory, _config(**extra))
    await index.build(np.arange(n), clustered(n, DIM, seed=0), tenants=rows)
    return index


def _model(n: int = 200, rows: Any = None) -> Model:
    model = Model()
    model.insert(range(n), clustered(n, DIM, seed=0), rows)
    return model


def test_invalid_tenant_error_is_exported_and_a_value_error() -> None:
    from vectordb import InvalidTenantError

    assert issubclass(InvalidTenantError, InvalidArgumentError)
    assert issubclass(InvalidTenantError, ValueError)


def test_tenancy_config_fields() -> None:
    config = IndexConfig(dim=4)
    assert config.tenancy is False
    assert (config.shortlist_limit, config.tenant_tree_branching, config.tenant_leaf_size) == (
        256,
        16,
        256,
    )
    for field in ("shortlist_limit", "tenant_tree_branching", "tenant_leaf_size"):
        for bad in (0, -1, 2.5, "4", True):
            with pytest.raises(IndexConfigError, match=field):
                IndexConfig(dim=4, tenancy=True, **{field: bad})
    with pytest.raises(IndexConfigError, match="tenancy"):
        IndexConfig(dim=4, tenancy="yes")  # type: ignore[arg-type]
    with pytest.raises(IndexConfigError, match="tenant_candidates"):
        SearchParams(tenant_candidates=-1)
    assert SearchParams().tenant_candidates is None
    assert IndexConfig.from_dict(_config().to_dict()) == _config()
    old = IndexConfig(dim=4).to_dict()
    for field in ("tenancy", "shortlist_limit", "tenant_tree_branching", "tenant_leaf_size"):
        old.pop(field)  # written before tenancy existed
    assert IndexConfig.from_dict(old).tenancy is False


def test_every_tenant_call_on_an_index_without_tenancy_is_a_config_error(tmp_path: Path) -> None:
    async def main() -> None:
        config = IndexConfig(dim=DIM, posting_limit=16, merge_threshold=3)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            vectors = clustered(100, DIM, seed=1)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.build(None, vectors, tenants=[[1]] * 100)
            assert index.stats()["n_vectors"] == 0
            await index.build(None, vectors, tenants=None)  # None: no tenants, fine
            ids = np.arange(5)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.insert(np.arange(100, 102), vectors[:2], tenants=[[1], []])
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.grant(ids, 1)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.revoke(ids, 1)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.delete_tenant(1)
            with pytest.raises(IndexConfigError, match="tenan"):
                index.count(1)
            with pytest.raises(IndexConfigError, match="tenan"):
                index.tenants_of(3)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.search(vectors[:2], 3, tenant=1)
            with pytest.raises(IndexConfigError, match="tenan"):
                await index.search(vectors[:2], 3, tenant=[1, "a"])
            assert index.stats()["n_vectors"] == 100  # the refused insert wrote nothing
            await index.insert(np.arange(100, 102), vectors[:2])  # without tenants: as ever
            await index.insert(np.arange(200, 202), vectors[:2], tenants=None)
            found, _ = await index.search(vectors[:2], 1, EXACT)  # no tenant: whole index
            assert set(found[:, 0].tolist()) <= {0, 1, 100, 101, 200, 201}

    asyncio.run(main())


BAD_TENANTS = [1.5, np.float64(2.0), None, b"t", True, False, np.bool_(True), -1, np.int64(-3),
               "", (1, 2), [1], {"a": 1}, 2.0]  # fmt: skip


def test_bad_tenant_ids_are_refused_with_nothing_written(tmp_path: Path) -> None:
    from vectordb import InvalidTenantError

    rows = [[i % 3, f"t{i % 4}"] if i % 2 else [] for i in range(200)]

    async def main() -> None:
        async with await _built(tmp_path / "i", rows=rows) as index:
            model = _model(rows=rows)
            tenants = [0, 1, 2, "t0", "t1", "t2", "t3"]
            before = index.stats()
            vectors = clustered(3, DIM, seed=9)

            async def refused(call: Any, what: str) -> None:
                with pytest.raises(InvalidTenantError) as caught:
                    result = call()
                    if asyncio.iscoroutine(result):
                        await result
                assert isinstance(caught.value, ValueError), what
                after = index.stats()
                assert after["wal_bytes"] == before["wal_bytes"], f"{what} wrote to the log"
                assert after["n_vectors"] == before["n_vectors"], what
                assert after["access_pairs"] == before["access_pairs"], what

            for bad in BAD_TENANTS:
                what = f"tenant {bad!r}"
                await refused(lambda b=bad: index.grant(np.arange(10), b), "grant " + what)
                await refused(lambda b=bad: index.revoke(np.arange(10), b), "revoke " + what)
                await refused(lambda b=bad: index.delete_tenant(b), "delete_tenant " + what)
                await refused(lambda b=bad: index.count(b), "count " + what)
                await refused(
                    lambda b=bad: index.search(vectors, 3, tenant=[1, b, "t1"]), "search " + what
                )
                # one tenant for the whole batch (None there is the unfiltered search)
                if bad is not None and not isinstance(bad, tuple | list | dict):
                    await refused(
                        lambda b=bad: index.search(vectors, 3, tenant=b), "search1 " + what
                    )
                # a bad tenant in the last row: no row goes in, nor any of its grants
                await refused(
                    lambda b=bad: index.insert(
                        np.arange(1000, 1003), vectors, tenants=[[1], ["t2", 0], [2, b]]
                    ),
                    "insert " + what,
                )
                await refused(
                    lambda b=bad: index.insert(
                        np.arange(1000, 1003),
                        vectors,
                        tenants=(np.array([0, 1, 2, 3]), [1, "t0", b]),
                    ),
                    "insert (csr) " + what,
                )
            await assert_index_matches(index, model, tenants, [*range(200), 1000, 1001, 1002])
            await index.insert(np.arange(1000, 1003), vectors, tenants=[[1], ["t2", 0], [2]])

        # build refuses a bad tenant too, leaving the index empty
        async with await SpannIndex.create(tmp_path / "j", _config()) as index:
            for bad in (1.5, None, b"x", True, -2, ""):
                with pytest.raises(InvalidTenantError):
                    await index.build(
                        np.arange(50), clustered(50, DIM, seed=0), tenants=[[0]] * 49 + [[bad]]
                    )
                assert index.stats()["n_vectors"] == 0
                assert index.count(0) == 0

    asyncio.run(main())


def test_rows_that_do_not_match_the_vectors_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with await _built(tmp_path / "i") as index:
            vectors = clustered(3, DIM, seed=9)
            wal = index.stats()["wal_bytes"]
            for rows in (
                [[1], [2]],  # too few rows
                [[1], [2], [3], [4]],  # too many
                (np.array([0, 1, 2]), [1, 2]),  # indptr too short
                (np.array([0, 1, 2, 5]), [1, 2, 3]),  # points past the tenants
                (np.array([0, 2, 1, 3]), [1, 2, 3]),  # not monotone
                (np.array([1, 2, 3, 3]), [1, 2, 3]),  # does not start at 0
            ):
                with pytest.raises(ValueError):
                    await index.insert(np.arange(500, 503), vectors, tenants=rows)
                assert index.stats()["wal_bytes"] == wal, rows
                assert index.stats()["n_vectors"] == 200, rows
                assert index.count(1) == 0
            with pytest.raises(ValueError):
                await index.search(vectors, 3, tenant=[1, 2])  # three queries, two tenants

    asyncio.run(main())


def test_both_row_forms_agree(tmp_path: Path) -> None:
    lists = [[i % 7, f"s{i % 3}"] if i % 3 else [i % 5] for i in range(200)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in lists])]).astype(np.int64)
    csr = (indptr, [t for row in lists for t in row])
    int_lists = [[i % 7, i % 11 + 100] if i % 3 else [] for i in range(200)]
    int_indptr = np.concatenate([[0], np.cumsum([len(r) for r in int_lists])]).astype(np.int32)
    int_csr = (int_indptr, np.array([t for row in int_lists for t in row], np.int32))

    async def main() -> None:
        for name, rows, same in (("a", lists, lists), ("b", csr, lists), ("c", int_csr, int_lists)):
            async with await _built(tmp_path / name, rows=rows) as index:
                model = _model(rows=same)
                tenants = sorted(model.tenants(), key=str)
                await assert_index_matches(index, model, tenants, range(200), f"{name}: ")
                # numpy tenant arrays per row, and tuples, as rows of insert
                rows2 = [np.array([3, 4]), (5,), {"s1"}, []]
                await index.insert(np.arange(300, 304), clustered(4, DIM, seed=4), tenants=rows2)
                model.insert(range(300, 304), clustered(4, DIM, seed=4), rows2)
                await assert_index_matches(index, model, [3, 4, 5, "s1"], range(300, 304))

    asyncio.run(main())


def test_int_and_str_tenants_are_different_and_numpy_ints_are_ints(tmp_path: Path) -> None:
    async def main() -> None:
        async with await _built(tmp_path / "i") as index:
            model = _model()
            assert await index.grant(np.arange(0, 10), 5) == 10
            assert await index.grant(np.arange(5, 20), "5") == 15
            assert await index.grant([3, 4], np.int64(5)) == 0  # the same tenant as 5
            assert await index.grant([3, 4], np.int32(5)) == 0
            assert await index.grant(np.arange(30, 33), np.uint8(7)) == 3
            for args in ((range(10), 5), (range(5, 20), "5"), (range(30, 33), 7)):
                model.grant(*args)
            assert index.count(5) == 10 and index.count("5") == 15
            assert index.count(np.int64(5)) == 10 and index.count("05") == 0
            got = index.tenants_of(7)
            assert sorted(map(repr, got)) == ["'5'", "5"]
            assert {type(t) for t in got} == {int, str}  # python values back, not numpy
            assert index.tenants_of(np.int64(31)) == [7]
            assert type(index.tenants_of(31)[0]) is int
            queries = clustered(6, DIM, seed=2)
            for tenant in (5, "5", np.int64(5), 7):
                result = await index.search(queries, 20, EXACT, tenant=tenant)
                assert_exact(Metric.L2, model, queries, 20, tenant, result)
            assert await index.revoke(np.arange(0, 20), "5") == 15
            assert index.count(5) == 10 and index.count("5") == 0
            assert await index.delete_tenant(5) == 10
            assert index.count(5) == 0 and index.count(7) == 3
            found, _ = await index.search(queries, 5, tenant="5")
            assert (found == -1).all()

    asyncio.run(main())


def test_grants_of_unknown_or_deleted_ids_are_ignored(tmp_path: Path) -> None:
    async def main() -> None:
        async with await _built(tmp_path / "i") as index:
            assert await index.delete(np.arange(10, 20)) == 10
            assert await index.grant(np.arange(5, 25), "t") == 10  # 5..9 and 20..24
            assert await index.grant(np.array([10**9, 10**12, 15]), "t") == 0
            assert await index.grant(np.arange(5, 25), "t") == 0  # already granted
            assert await index.grant(np.array([], np.int64), "t") == 0
            assert await index.grant([], "empty") == 0
            assert index.count("t") == 10
            assert index.tenants_of(15) == [] and index.tenants_of(10**9) == []
            assert await index.revoke(np.arange(0, 100), "t") == 10
            assert await index.revoke(np.arange(0, 100), "t") == 0
            assert await index.revoke(np.arange(0, 100), "never") == 0
            assert await index.delete_tenant("never") == 0
            assert index.count("t") == 0 and index.count("never") == 0
            # a deleted id inserted again starts with no tenants
            await index.grant([30, 31], "u")
            await index.delete([30])
            assert index.count("u") == 1 and index.tenants_of(30) == []
            await index.insert(np.array([30]), clustered(1, DIM, seed=8))
            assert index.tenants_of(30) == [] and index.count("u") == 1
            await index.insert(np.array([10]), clustered(1, DIM, seed=8), tenants=[["u"]])
            assert index.tenants_of(10) == ["u"] and index.count("u") == 2
            stats = index.stats()
            assert stats["access_pairs"] == 2
            for key in ("tenants", "tenant_resident_bytes", "tenant_disk_bytes", "shortlists"):
                assert isinstance(stats[key], int) and stats[key] >= 0, key

    asyncio.run(main())


def test_delete_tenant_leaves_nothing_and_others_untouched(tmp_path: Path) -> None:
    rows = [["a", "b"] if i % 2 else ["a"] for i in range(200)]

    async def main() -> None:
        async with await _built(tmp_path / "i", rows=rows) as index:
            model = _model(rows=rows)
            await index.grant(np.arange(0, 200, 3), 9)
            model.grant(range(0, 200, 3), 9)
            assert await index.delete_tenant("a") == model.delete_tenant("a") == 200
            queries = clustered(10, DIM, seed=5)
            for params in (None, EXACT, SearchParams(tenant_candidates=1)):
                found, _ = await index.search(queries, 10, params, tenant="a")
                assert (found == -1).all()
            await assert_index_matches(index, model, ["a", "b", 9], range(200))
            assert await index.delete_tenant("a") == 0
            await index.checkpoint()
        async with await SpannIndex.open(tmp_path / "i") as index:
            await assert_index_matches(index, model, ["a", "b", 9], range(200), "reopened: ")
            assert await index.grant([1, 2], "a") == 2  # the name can be used again
            model.grant([1, 2], "a")
            result = await index.search(queries, 5, EXACT, tenant="a")
            assert_exact(Metric.L2, model, queries, 5, "a", result)

    asyncio.run(main())


def test_unknown_tenant_and_k_above_a_tenants_size(tmp_path: Path) -> None:
    async def main() -> None:
        async with await _built(tmp_path / "i") as index:
            queries = clustered(4, DIM, seed=6)
            found, _ = await index.search(queries, 10, tenant="nobody")
            assert found.shape == (4, 10) and (found == -1).all()
            assert index.count("nobody") == 0
            await index.grant([3, 77, 150], "few")
            found, _ = await index.search(queries, 10, EXACT, tenant="few")
            assert all(sorted(row[:3]) == [3, 77, 150] for row in found.tolist())
            assert (found[:, 3:] == -1).all()
            found, _ = await index.search(queries, 10, tenant="few")  # default params
            assert_no_leaks(found, ["few"] * 4, lambda t: {3, 77, 150})
            assert (found[:, 0] >= 0).all()
            # a batch mixing the two
            found, _ = await index.search(queries, 2, EXACT, tenant=["few", "nobody"] * 2)
            assert (found[1::2] == -1).all() and (found[0::2] >= 0).all()
            # a tenant of one id finds it from anywhere
            await index.grant([199], "one")
            found, _ = await index.search(queries * 100, 1, tenant="one")
            assert found[:, 0].tolist() == [199] * 4

    asyncio.run(main())


def test_delete_drops_the_grants_of_the_ids(tmp_path: Path) -> None:
    rows = [[0, "x"]] * 200

    async def main() -> None:
        async with await _built(tmp_path / "i", rows=rows) as index:
            model = _model(rows=rows)
            assert await index.delete(np.arange(0, 200, 2)) == model.delete(range(0, 200, 2))
            await assert_index_matches(index, model, [0, "x"], range(200))
            queries = clustered(20, DIM, seed=7)
            for t in (0, "x"):
                result = await index.search(queries, 10, EXACT, tenant=t)
                assert_exact(Metric.L2, model, queries, 10, t, result)
                found, _ = await index.search(queries, 10, tenant=t)
                assert_no_leaks(found, [t] * 20, model.readable)

    asyncio.run(main())


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpoint", "log"])
def test_reopen_keeps_everything(tmp_path: Path, checkpoint: bool) -> None:
    """From the checkpoint, or (the index left without closing, its engine closed under it,
    as a power cut would) from the write-ahead log alone."""
    from tiers.io import IORuntime, ThreadEngine
    from tiers.testing.faulty_engine import FaultyEngine

    rows = [[i % 4, "even" if i % 2 == 0 else "odd"] for i in range(200)]

    async def main() -> None:
        engine = FaultyEngine(ThreadEngine(4))
        index = await SpannIndex.create(
            tmp_path / "i", _config(), runtime=IORuntime(engine=lambda *_: engine)
        )
        await index.build(np.arange(200), clustered(200, DIM, seed=0), tenants=rows)
        model = _model(rows=rows)
        await index.checkpoint()
        ops: list[tuple[Any, ...]] = [
            ("grant", np.arange(0, 50), "big"),
            ("grant", np.arange(10, 20), 10**15),
            ("revoke", np.arange(0, 100, 3), "even"),
            ("delete", np.arange(190, 200)),
            ("delete_tenant", 3),
            ("insert", np.arange(500, 510), clustered(10, DIM, seed=3), [["big", 3]] * 10),
            ("grant", np.arange(495, 505), "új"),
        ]
        for op in ops:
            kind, *args = op
            if kind == "insert":
                got = await index.insert(args[0], args[1], tenants=args[2])
            else:
                got = await getattr(index, kind)(*args)
            want = model.apply(op)
            if kind != "insert":
                assert got == want, op
        tenants = [0, 1, 2, 3, "even", "odd", "big", 10**15, "új", "none"]
        ids = [*range(200), *range(495, 510)]
        await assert_index_matches(index, model, tenants, ids, "before: ")
        queries = clustered(12, DIM, seed=11)
        stats = index.stats()
        if not checkpoint:
            await engine.power_cut("none")  # whatever was not synced is lost; the engine dies
        await index.aclose()
        await engine.aclose()
        async with await SpannIndex.open(tmp_path / "i") as index:
            assert index.config.tenancy and index.config.shortlist_limit == 2
            await assert_index_matches(index, model, tenants, ids, "reopened: ")
            after = await index.search(queries, 6, tenant=tenants[:6] * 2)
            assert_no_leaks(after.ids, tenants[:6] * 2, model.readable)
            assert index.stats()["access_pairs"] == stats["access_pairs"]
            for t in tenants:
                result = await index.search(queries, 8, EXACT, tenant=t)
                assert_exact(Metric.L2, model, queries, 8, t, result, f"{t!r}: ")

    asyncio.run(main())


@pytest.mark.parametrize("metric", ["l2", "cosine", "ip"])
def test_shortlists_split_and_merge_and_stay_exact(tmp_path: Path, metric: str) -> None:
    """Granting a dense region to a tenant, 2 ids per shortlist, makes many shortlists;
    revoking most of it merges them back; every exact search equals brute force."""
    n = 600

    async def main() -> None:
        config = _config(metric=metric)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            vectors = clustered(n, DIM, seed=12, clusters=5)
            await index.build(np.arange(n), vectors)
            model = Model()
            model.insert(range(n), vectors)
            queries = clustered(30, DIM, seed=13, clusters=5)
            m = Metric(metric)
            for start in range(0, 300, 60):
                await index.grant(np.arange(start, start + 60), "grow")
                model.grant(range(start, start + 60), "grow")
                result = await index.search(queries, 10, EXACT, tenant="grow")
                assert_exact(m, model, queries, 10, "grow", result, f"granted {start + 60}: ")
                # the copies wait for the checkpoint (pending grants, scored from home copies)
                assert index.stats()["pending_grants"] == 60
                await index.checkpoint()  # placed into the shortlists the earlier calls made
                assert index.stats()["pending_grants"] == 0
                result = await index.search(queries, 10, EXACT, tenant="grow")
                assert_exact(m, model, queries, 10, "grow", result, f"settled {start + 60}: ")
            grown = index.stats()["shortlists"]
            assert grown >= 30, f"300 ids of one tenant, tau 2, in {grown} shortlists"
            for start in range(0, 290, 58):
                await index.revoke(np.arange(start, start + 58), "grow")
                model.revoke(range(start, start + 58), "grow")
                result = await index.search(queries, 10, EXACT, tenant="grow")
                assert_exact(m, model, queries, 10, "grow", result, f"revoked to {start}: ")
            assert index.count("grow") == 10
            # merges wait for the next checkpoint (Tenancy.settle_pending)
            assert index.stats()["shortlists"] == grown, "revokes merged before a checkpoint"
            await index.checkpoint()
            assert index.stats()["shortlists"] < grown / 4, "shortlists did not merge back"
            await index.delete(np.arange(290, 300))
            assert index.count("grow") == 0
            found, _ = await index.search(queries, 3, EXACT, tenant="grow")
            assert (found == -1).all()

    asyncio.run(main())


SHARES = {"p40": 5, "p6": 16, "p1": 100, "p0.3": 300}  # tenant: every how many-th vector


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_tenants_of_every_size_in_one_batch(tmp_path: Path, metric: str) -> None:
    """Tenants reading 40%, 6%, 1% and 0.3% of the index in the same batch (the large ones
    on the filtered shared lists, the small ones on their shortlists): with default params no
    leaks, k results wherever the tenant has k, recall@10 >= 0.9 for each; and
    ``tenant_candidates=0`` alone (the contract: every shortlist) is exact for every size."""
    n = 2000

    async def main() -> None:
        vectors = clustered(n, DIM, seed=20)
        rows = [[t for t, every in SHARES.items() if i % every == 0] for i in range(n)]
        model = Model()
        model.insert(range(n), vectors, rows)
        m = Metric(metric)
        config = _config(metric=metric, shortlist_limit=8, tenant_leaf_size=8)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(np.arange(n), vectors, tenants=rows)
            queries = clustered(80, DIM, seed=21)
            tenants = list(SHARES) * 20
            found, _ = await index.search(queries, 10, tenant=tenants)
            assert_no_leaks(found, tenants, model.readable)
            exact = await index.search(
                queries, 10, SearchParams(tenant_candidates=0), tenant=tenants
            )
            assert_exact(m, model, queries, 10, tenants, exact, "tenant_candidates=0: ")
            for t in SHARES:
                rows_t = [q for q, name in enumerate(tenants) if name == t]
                want = min(10, model.count(t))
                filled = (found[rows_t] >= 0).sum(1)
                assert (filled == want).all(), f"{t}: {filled.tolist()} results, want {want}"
                hits = [len(set(found[q].tolist()) & set(exact.ids[q].tolist())) for q in rows_t]
                assert np.mean(hits) / want >= 0.9, (t, np.mean(hits) / want)

    asyncio.run(main())


def test_tenant_call_edge_cases(tmp_path: Path) -> None:
    """Repeated ids count once; ids that are not integers, a bad k or query width are refused
    with nothing written; a huge k is cut to what the index holds; big ints and long unicode
    names are tenants like any other; a closed index refuses tenant calls."""
    from vectordb import InvalidVectorsError
    from vectordb.errors import IndexClosedError

    async def main() -> None:
        index = await _built(tmp_path / "i")
        queries = clustered(3, DIM, seed=7)
        assert await index.grant([40, 40, 41], "dup") == 2
        assert await index.revoke(np.array([40, 40]), "dup") == 1
        wal = index.stats()["wal_bytes"]
        with pytest.raises(ValueError):
            await index.grant(np.array([1.5, 2.0]), "dup")
        with pytest.raises(ValueError):
            await index.revoke(np.array([[41]]), "dup")
        for bad_k in (0, -1, 2.5, True):
            with pytest.raises(InvalidVectorsError, match="k must be"):
                await index.search(queries, bad_k, tenant="dup")
        with pytest.raises(InvalidVectorsError):
            await index.search(np.ones((2, DIM + 1), np.float32), 3, tenant="dup")
        assert index.stats()["wal_bytes"] == wal and index.count("dup") == 1
        found, scores = await index.search(queries, 10**9, tenant="dup")  # not 10**9 columns
        assert found.shape == scores.shape and found.shape[1] <= 200
        assert (found[:, 0] == 41).all() and (found[:, 1:] == -1).all()
        big, name = 2**63 - 1, "テナント-" + "é" * 300
        assert await index.grant(np.arange(10), big) == 10
        assert await index.grant(np.arange(5, 15), name) == 10
        assert index.count(big) == 10 and index.count(name) == 10
        assert set(index.tenants_of(7)) == {big, name}
        await index.aclose()
        index = await SpannIndex.open(tmp_path / "i")
        assert index.count(big) == 10 and index.count(name) == 10
        assert set(index.tenants_of(7)) == {big, name}
        await index.aclose()
        with pytest.raises(IndexClosedError):
            await index.grant([1], "dup")
        with pytest.raises(IndexClosedError):
            await index.search(queries, 3, tenant="dup")

    asyncio.run(main())
