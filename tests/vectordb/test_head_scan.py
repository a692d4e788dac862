"""head_scan: the bfloat16-bounded head scan returns exactly the heads and distances a float64
brute force finds, on data built to defeat a rounded product (a large common offset, heads a
rounding apart, exact ties, wide magnitudes); and its OpenMP setting stays on the calling
thread for the call."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import vectordb.navigator as navigator_module  # noqa: E402
from tests.vectordb.helpers import clustered  # noqa: E402
from tiers.io import cpu_threads  # noqa: E402
from vectordb import IndexConfig, SearchParams, SpannIndex, head_scan  # noqa: E402
from vectordb.metric import Metric  # noqa: E402


def _exact(metric: Metric, queries: np.ndarray, heads: np.ndarray) -> np.ndarray:
    q, h = queries.astype(np.float64), heads.astype(np.float64)
    if metric is Metric.L2:
        return ((q[:, None, :] - h[None, :, :]) ** 2).sum(-1)
    return -(q @ h.T)


def _check(metric: Metric, queries: np.ndarray, heads: np.ndarray, want: int) -> None:
    """The reported distances are the ``want`` smallest true ones, each position's true
    distance is the one reported (ties may pick either head), nearest first."""
    bf = head_scan.BfloatHeads(heads, metric is Metric.L2)
    dist, pos = head_scan.nearest(bf, queries, heads, want)
    true = _exact(metric, queries, heads)
    smallest = np.sort(true, axis=1)[:, :want]
    # float64 sums, rounded to float32 once (inner products: relative to |q||h|)
    scale = 1e-6 * (np.abs(smallest) if metric is Metric.L2 else np.abs(true).max())
    np.testing.assert_array_less(np.abs(dist - smallest), scale + 1e-35)
    chosen = np.take_along_axis(true, pos, axis=1)
    np.testing.assert_array_less(np.abs(chosen - smallest), scale + 1e-35)
    assert all(len(set(row)) == want for row in pos.tolist())
    assert (np.diff(dist, axis=1) >= 0).all()


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_nearest_is_exact(data: st.DataObject) -> None:
    metric = data.draw(st.sampled_from([Metric.L2, Metric.IP]), label="metric")
    n_heads = data.draw(st.integers(2, 300), label="heads")
    dim = data.draw(st.sampled_from([1, 3, 16, 97]), label="dim")
    want = data.draw(st.integers(1, n_heads), label="want")
    offset = data.draw(st.sampled_from([0.0, 1.0, 1e3]), label="offset")
    magnitude = data.draw(st.sampled_from([1e-3, 1.0, 1e4]), label="magnitude")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    heads = (offset + magnitude * rng.normal(size=(n_heads, dim))).astype(np.float32)
    queries = (offset + magnitude * rng.normal(size=(9, dim))).astype(np.float32)
    _check(metric, queries, heads, want)


@pytest.mark.parametrize("metric", [Metric.L2, Metric.IP])
def test_heads_a_rounding_apart_and_ties(metric: Metric) -> None:
    """Heads bfloat16 cannot tell apart (relative gaps of 1e-4..1e-6 on a large offset, and
    exact duplicates): the bounds must keep them all, the exact pass must order them."""
    rng = np.random.default_rng(5)
    base = (100.0 + rng.normal(size=(1, 64))).astype(np.float32)
    gaps = np.geomspace(1e-6, 1e-4, 200)[:, None] * rng.normal(size=(200, 64))
    heads = np.concatenate([base * (1 + gaps), np.repeat(base, 5, axis=0)]).astype(np.float32)
    queries = (base + 0.01 * rng.normal(size=(20, 64))).astype(np.float32)
    for want in (1, 4, 30):
        _check(metric, queries, heads, want)


@pytest.mark.parametrize("metric", [Metric.L2, Metric.IP])
def test_rows_put_and_moved_after_the_centre_was_fixed(metric: Metric) -> None:
    """Heads added later (far from the centre fixed at first) and heads moved into holes, as
    the navigator does on splits and merges: still exact over the current rows."""
    rng = np.random.default_rng(7)
    first = rng.normal(size=(100, 24)).astype(np.float32)
    later = (40.0 + rng.normal(size=(150, 24))).astype(np.float32)
    bf = head_scan.BfloatHeads(first, metric is Metric.L2, capacity=110)
    heads = np.concatenate([first, np.zeros((150, 24), np.float32)])
    for start in range(100, 250, 50):  # grows past its capacity
        bf.put(start, later[start - 100 : start - 50])
        heads[start : start + 50] = later[start - 100 : start - 50]
    for hole in (3, 120, 7):  # the last row moves into the hole; one row fewer
        last = bf.count - 1
        bf.move(last, hole)
        heads[hole] = heads[last]
        bf.count = last
    heads = heads[: bf.count]
    queries = np.concatenate([first[:5] + 0.1, later[:5] - 0.1, 20.0 + first[:3]])
    dist, pos = head_scan.nearest(bf, queries.astype(np.float32), heads, 6)
    true = _exact(metric, queries.astype(np.float32), heads)
    np.testing.assert_allclose(dist, np.sort(true, axis=1)[:, :6], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.take_along_axis(true, pos, axis=1), dist, rtol=1e-6, atol=1e-6)


def test_product_shapes_are_a_fixed_few_as_heads_and_batches_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch keeps code for every shape of product it ran, for good: a head added per split and
    every batch size must not each make a new shape (in the REST soak the server's memory grew
    +31 MiB within a minute from that, and +4.5 MiB per 128 heads after), and the overlapping
    last chunk and padded query rows must not change the answer."""
    rng = np.random.default_rng(5)
    heads = rng.normal(size=(2300, 16)).astype(np.float32)
    bf = head_scan.BfloatHeads(heads[:900], True)
    shapes: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    matmul = torch.matmul

    def recorded(a: object, b: object, **kwargs: object) -> object:
        shapes.add((tuple(a.shape), tuple(b.shape)))  # type: ignore[attr-defined]
        return matmul(a, b, **kwargs)

    monkeypatch.setattr(torch, "matmul", recorded)
    for n in range(900, 2300, 53):  # heads added by splits, below one chunk and past two
        bf.put(bf.count, heads[bf.count : n + 1])
        for q in range(8, 140, 11):
            dots, _ = bf.approximate_dots(rng.normal(size=(q, 16)).astype(np.float32))
            assert dots.shape[0] >= q and dots.shape[1] >= bf.count
    # one chunk of heads times a query piece of 8, 16, 32 or 64 rows, whatever the counts
    assert shapes <= {((head_scan.HEAD_CHUNK, 16), (16, p)) for p in (8, 16, 32, 64)}, shapes
    for n_queries in (9, 70):
        queries = rng.normal(size=(n_queries, 16)).astype(np.float32)
        dist, pos = head_scan.nearest(bf, queries, heads[: bf.count], 5)
        true = _exact(Metric.L2, queries, heads[: bf.count])
        np.testing.assert_allclose(dist, np.sort(true, axis=1)[:, :5], rtol=1e-6, atol=1e-6)
        chosen = np.take_along_axis(true, pos, axis=1)
        np.testing.assert_allclose(chosen, dist, rtol=1e-6, atol=1e-6)


def test_warm_up_runs_every_shape_the_scan_will_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """warm_up(dim) makes torch's code for each product shape now, not while serving."""
    shapes: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    matmul = torch.matmul

    def recorded(a: object, b: object, **kwargs: object) -> object:
        shapes.add((tuple(a.shape), tuple(b.shape)))  # type: ignore[attr-defined]
        return matmul(a, b, **kwargs)

    monkeypatch.setattr(torch, "matmul", recorded)
    head_scan.warm_up(24)
    assert {((head_scan.HEAD_CHUNK, 24), (24, p)) for p in (8, 16, 32, 64)} <= shapes


def test_fashion_like_pixels() -> None:
    """Non-negative 784-d integer pixels (large norms, small differences): exact."""
    rng = np.random.default_rng(6)
    heads = rng.integers(0, 256, size=(600, 784)).astype(np.float32)
    queries = (heads[:30] + rng.integers(-3, 4, size=(30, 784))).astype(np.float32)
    _check(Metric.L2, queries, heads, 8)


def test_product_runs_on_the_calling_thread_only() -> None:
    """Inside the call the thread's OpenMP team is one thread; before and after (and on any
    other thread) torch's setting is as it was."""
    if not cpu_threads.torch_openmp():
        pytest.skip("torch ships no libgomp here: the product keeps torch's threads")
    before = torch.get_num_threads()
    with cpu_threads.this_thread_openmp_alone():
        assert torch.get_num_threads() == 1
        seen: list[int] = []
        other = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        other.start()
        other.join()
        assert seen == [before]  # another thread keeps torch's setting
    assert torch.get_num_threads() == before


def test_an_index_answers_alike_through_either_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole index (batch split over two threads, reads started per 32-query piece) finds
    the same neighbours with the bfloat16-bounded scan as with the float32 one."""
    vectors = clustered(4000, 32, seed=51)
    queries = clustered(300, 32, seed=52)
    found = {}

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=32)) as index:
            await index.build(None, vectors)
            for scan in ("float32", "bfloat16"):
                monkeypatch.setattr(navigator_module, "BFLOAT16_FROM_CELLS", 1 << 62)
                if scan == "bfloat16":
                    monkeypatch.setattr(navigator_module, "BFLOAT16_FROM_CELLS", 0)
                    monkeypatch.setattr(head_scan, "bfloat16_is_native", lambda: True)
                found[scan] = await index.search(queries, k=10, params=SearchParams(8))
            assert index.navigator._bfloat is not None  # the second pass went through it

    asyncio.run(main())
    same = (found["float32"][0] == found["bfloat16"][0]).all(axis=1).mean()
    assert same >= 0.99  # head distances summed differently may swap an exact tie
    np.testing.assert_allclose(found["float32"][1], found["bfloat16"][1], rtol=1e-4, atol=1e-4)
