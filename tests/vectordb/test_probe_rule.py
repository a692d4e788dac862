"""The default list count measured on the index (probe_rule): the rule against a plain model,
and on diffuse data, where the sqrt-of-heads floor falls short, recall against brute force."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vectordb import IndexConfig, SearchParams, SpannIndex, default_postings, probe_rule
from vectordb.meta import MetaStore
from vectordb.metric import Metric
from vectordb.probe_rule import measure_postings, postings_for_target

from .helpers import brute_force, recall


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-1, 60), min_size=0, max_size=40),
    st.sampled_from([0.5, 0.9, 0.95, 0.97, 1.0]),
    st.integers(1, 20),
    st.integers(20, 70),
)
def test_the_least_count_reaching_the_target(
    ranks: list[int], target: float, floor: int, wide: int
) -> None:
    array = np.asarray(ranks, np.int64).reshape(-1, 1)
    got = postings_for_target(array, target, floor, wide)
    counted = [r for r in ranks if r >= 0]
    if not counted:
        assert got == floor
        return

    def share(p: int) -> float:  # the plain model: the share of neighbours within p lists
        return sum(r < p for r in counted) / len(counted)

    model = next((p for p in range(1, 200) if share(p) >= target - 1e-9), 200)
    assert got == min(max(floor, model), wide)


def test_diffuse_data_gets_the_lists_it_needs(tmp_path: Path) -> None:
    # diffuse data: a query's neighbours spread over far more lists than sqrt(heads) predicts
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((6000, 24)).astype(np.float32)
    queries = rng.standard_normal((60, 24)).astype(np.float32)
    truth, _ = brute_force(Metric.L2, np.arange(6000), vectors, queries, 10)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=24)) as index:
            await index.build(None, vectors)
            stats = index.stats()
            floor = default_postings(stats["n_heads"])
            assert stats["default_max_postings_floor"] == floor
            assert floor < stats["default_max_postings"] <= 10 * floor
            measured, _ = await index.search(queries, 10)  # SearchParams(): the default
            at_floor, _ = await index.search(queries, 10, SearchParams(max_postings=floor))
            singles = [(await index.search(q, 10))[0][0] for q in queries[:30]]
            counters = dict(index.store.counters)
            again = await measure_postings(index)
            assert again == stats["default_max_postings"]  # a fixed seed: the same measure
            assert index.store.counters == counters  # searches' read counters untouched
        assert recall(measured, truth) >= 0.95 > 0.9 > recall(at_floor, truth)
        assert recall(np.stack(singles), truth[:30]) >= 0.95
        assert stats["default_max_postings_source"] == "measured"
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=1 << 20) as index:
            # kept with the checkpoint: read back, not measured again at open
            assert index.stats()["default_max_postings"] == stats["default_max_postings"]
            assert index.stats()["default_max_postings_source"] == "checkpoint"
            lsn = index.checkpointed_lsn
        # a measure taken by another rule is not trusted: the open measures again
        meta = MetaStore(str(tmp_path / "i" / "meta"))
        try:
            stale = {**probe_rule.record(1, stats["n_heads"]), "rule": "another rule"}
            assert meta.update_state({probe_rule.STATE_KEY: stale}, lsn)
        finally:
            meta.close()
        async with await SpannIndex.open(tmp_path / "i") as index:
            assert index.stats()["default_max_postings_source"] == "measured"
            assert index.stats()["default_max_postings"] == stats["default_max_postings"]
        async with await SpannIndex.open(tmp_path / "i") as index:  # ... and kept again
            assert index.stats()["default_max_postings_source"] == "checkpoint"

    asyncio.run(main())


def test_saved_measure_needs_the_same_rule_and_heads() -> None:
    entry = probe_rule.record(37, 400)
    assert probe_rule.saved_postings({probe_rule.STATE_KEY: entry}, 400) == 37
    assert probe_rule.saved_postings({probe_rule.STATE_KEY: entry}, 401) is None
    assert probe_rule.saved_postings({}, 400) is None
    for bad in ({**entry, "rule": "x"}, {**entry, "postings": 0}, {**entry, "postings": True}):
        assert probe_rule.saved_postings({probe_rule.STATE_KEY: bad}, 400) is None
    assert probe_rule.saved_postings({probe_rule.STATE_KEY: [37]}, 400) is None


def test_clustered_data_keeps_the_floor_when_it_suffices(tmp_path: Path) -> None:
    # tight, well separated clusters: the nearest lists hold the neighbours
    rng = np.random.default_rng(4)
    centres = rng.standard_normal((400, 16)).astype(np.float32) * 10
    vectors = centres[rng.integers(400, size=5000)]
    vectors += 0.05 * rng.standard_normal(vectors.shape).astype(np.float32)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=16)) as index:
            await index.build(None, vectors)
            stats = index.stats()
        assert stats["n_heads"] >= 256  # measured, not the small-index shortcut
        assert stats["default_max_postings"] <= 3 * stats["default_max_postings_floor"]

    asyncio.run(main())
