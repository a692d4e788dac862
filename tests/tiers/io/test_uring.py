"""UringEngine: the engine contract, plus what only io_uring has (registered buffers, ring)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tiers.io.engine import IOEngine
from tiers.io.errors import InvalidArgumentError
from tiers.io.pool import AlignedBufferPool
from tiers.io.uring.engine import UringEngine
from tiers.testing.engine_contract import EngineContract, run

pytestmark = pytest.mark.uring


class TestUringContract(EngineContract):
    def make_engine(self, queue_depth: int = 32) -> IOEngine:
        return UringEngine(queue_depth)


def test_registered_pool_buffers_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "d.bin"
    data = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    pool = AlignedBufferPool(64 * 1024, 8)
    offsets = np.arange(0, 1 << 20, 64 * 1024)[::-1].copy()

    async def body() -> dict:
        engine = UringEngine(16)
        await engine.register_buffers([pool.arena])
        file = await engine.open(path, write=True, direct=True)
        held = [await pool.acquire() for _ in range(8)]
        for buf, off in zip(held, offsets[:8].tolist(), strict=True):
            assert await engine.read_into(file, off, buf.array) == buf.array.size
        # a write from a registered buffer (WRITE_FIXED) lands where asked
        held[0].array[:] = 7
        await engine.write_from(file, 0, held[0].array)
        await engine.fsync(file)
        for i, buf in enumerate(held):
            if i:
                off = offsets[i]
                assert np.array_equal(buf.array, data[off : off + buf.array.size])
            buf.release()
        stats = engine.stats()
        await engine.aclose()
        return stats

    stats = run(body)
    assert stats["errors"] == 0
    assert path.read_bytes()[:65536] == bytes([7]) * 65536
    pool.close()


def test_queue_depth_bounds_requests_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "q.bin"
    path.write_bytes(bytes(range(256)) * 4096)
    seen: list[int] = []

    async def body() -> None:
        engine = UringEngine(4)
        file = await engine.open(path)
        push, dequeue = engine._push, engine._dequeue_singles

        def spy(*args, **kwargs):  # records the in-flight count after every push
            push(*args, **kwargs)
            seen.append(engine._inflight)

        def dequeue_spy(count: int) -> None:  # the compiled loop filled slots from the queue
            dequeue(count)
            seen.append(engine._inflight)

        engine._push = spy  # type: ignore[method-assign]
        engine._dequeue_singles = dequeue_spy  # type: ignore[method-assign]
        buffers = np.zeros((50, 512), np.uint8)
        await asyncio.gather(*(engine.read_into(file, i * 512, buffers[i]) for i in range(50)))
        assert all(buffers[i].tobytes() == (bytes(range(256)) * 2) for i in range(50))
        await engine.aclose()

    run(body)
    assert seen and max(seen) <= 4


def test_probe_reports_available_here() -> None:
    assert UringEngine.probe() is None


def test_using_an_engine_from_a_second_loop_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "l.bin"
    path.write_bytes(b"x" * 4096)
    engine = UringEngine(4)

    async def first() -> None:
        file = await engine.open(path)
        assert await engine.read_into(file, 0, bytearray(10)) == 10

    async def second() -> None:
        with pytest.raises(InvalidArgumentError, match="another event loop"):
            await engine.open(path)

    asyncio.run(first())
    asyncio.run(second())
