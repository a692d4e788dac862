"""IORuntime: one engine per loop shared by every product on it, leases, executors, buffers."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from tiers.io import (
    BufferCache,
    EngineClosedError,
    InvalidArgumentError,
    IORuntime,
    ThreadEngine,
    default_runtime,
)
from vectordb import IndexConfig, SpannIndex


@pytest.fixture
def runtime():
    made = IORuntime(engine="thread", queue_depth=8)
    yield made
    made.close()


def test_products_on_one_loop_share_one_engine_until_the_last_lease(runtime: IORuntime) -> None:
    async def main() -> None:
        first = runtime.acquire_engine()
        second = runtime.acquire_engine()
        assert first is second and runtime.stats()["leases"] == 2
        await runtime.release_engine(first)
        assert not first.closed  # one lease left
        await runtime.release_engine(second)
        assert first.closed and runtime.stats()["engines_open"] == 0
        assert runtime.acquire_engine() is not first  # a fresh one after the last release

    asyncio.run(main())


def test_each_loop_gets_its_own_engine(runtime: IORuntime) -> None:
    async def lease() -> object:
        return runtime.acquire_engine()

    mine = asyncio.run(lease())
    on_runtime_loop = runtime.submit(lease()).result(timeout=10)
    assert mine is not on_runtime_loop
    assert runtime.stats()["engines_opened"] == 2
    runtime.close()  # closes the engine leased on its own loop
    assert on_runtime_loop.closed  # type: ignore[attr-defined]


def test_two_indexes_share_the_engine_of_their_loop(runtime: IORuntime, tmp_path: Path) -> None:
    async def main() -> None:
        config = IndexConfig(dim=8)
        one = await SpannIndex.create(tmp_path / "a", config, runtime=runtime)
        two = await SpannIndex.create(tmp_path / "b", config, runtime=runtime)
        assert one.engine is two.engine
        assert runtime.stats()["engines_open"] == 1
        vectors = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
        await one.build(None, vectors)
        await two.build(None, vectors[::-1].copy())
        assert (await one.search(vectors[:1], 1))[0][0][0] == 0
        await one.aclose()
        assert not two.engine.closed
        assert (await two.search(vectors[:1], 1))[0][0][0] == 63
        await two.aclose()
        assert runtime.stats()["engines_open"] == 0

    asyncio.run(main())


def test_an_injected_engine_factory_is_what_products_get(tmp_path: Path) -> None:
    made: list[ThreadEngine] = []

    def factory(queue_depth: int, env: object) -> ThreadEngine:
        made.append(ThreadEngine(queue_depth))
        return made[-1]

    runtime = IORuntime(engine=factory, queue_depth=4)

    async def main() -> None:
        index = await SpannIndex.create(tmp_path, IndexConfig(dim=4), runtime=runtime)
        assert index.engine is made[0] and made[0].queue_depth == 4
        await index.aclose()

    asyncio.run(main())
    runtime.close()
    assert len(made) == 1 and made[0].closed


def test_executors_run_work_and_count_it(runtime: IORuntime) -> None:
    async def main() -> tuple[str, str]:
        blocking = await runtime.run_blocking(lambda: threading.current_thread().name)
        cpu = await runtime.run_cpu(lambda: threading.current_thread().name)
        return blocking, cpu

    blocking, cpu = asyncio.run(main())
    assert blocking.startswith("tierkit-blocking") and cpu.startswith("tierkit-cpu")
    stats = runtime.stats()
    assert stats["blocking_calls"] == 1 and stats["cpu_calls"] == 1


def test_a_closed_runtime_refuses_new_leases() -> None:
    runtime = IORuntime(engine="thread")
    runtime.close()
    runtime.close()  # idempotent

    async def main() -> None:
        runtime.acquire_engine()

    with pytest.raises(EngineClosedError):
        asyncio.run(main())


@pytest.mark.parametrize(
    "kwargs",
    [{"queue_depth": 0}, {"cpu_threads": 0}, {"blocking_threads": 0}, {"queue_depth": True}],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        IORuntime(**kwargs)  # type: ignore[arg-type]


def test_the_default_runtime_is_one_per_process_until_closed() -> None:
    first = default_runtime()
    assert default_runtime() is first
    first.close()
    assert default_runtime() is not first


def test_the_buffer_cache_stays_bounded_and_consistent_under_threads() -> None:
    cache = BufferCache(max_cached_bytes=1 << 20)
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(500):
                size = int(rng.integers(1, 256 << 10))
                buffer = cache.take(size)
                assert buffer.nbytes >= size and buffer.ctypes.data % 4096 == 0
                buffer[:1] = seed  # owned: nobody else holds it
                cache.give(buffer)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    held = sum(buffer.nbytes for idle in cache._free.values() for buffer in idle)
    assert held == cache.cached_bytes <= 1 << 20
    assert cache.hits > 0
