"""AlignedBufferPool: aligned, reused, bounded, and waiting without blocking the loop."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest

from tiers.io.errors import EngineClosedError, InvalidArgumentError
from tiers.io.pool import AlignedBufferPool


def test_buffers_are_page_aligned_disjoint_and_reused() -> None:
    pool = AlignedBufferPool(8192, 4)
    held = [pool.try_acquire() for _ in range(4)]
    assert all(b is not None for b in held)
    addresses = sorted(b.array.__array_interface__["data"][0] for b in held)  # type: ignore[union-attr]
    assert all(a % 4096 == 0 for a in addresses)
    assert all(b - a >= 8192 for a, b in itertools.pairwise(addresses))
    assert pool.try_acquire() is None
    first = held[0]
    assert first is not None
    first.release()
    again = pool.try_acquire()
    assert again is first  # the same memory comes back: nothing is allocated per use
    for b in held[1:]:
        b.release()  # type: ignore[union-attr]
    again.release()
    pool.close()


def test_double_release_and_foreign_release_are_refused() -> None:
    pool, other = AlignedBufferPool(4096, 1), AlignedBufferPool(4096, 1)
    buffer = pool.try_acquire()
    assert buffer is not None
    buffer.release()
    with pytest.raises(InvalidArgumentError):
        buffer.release()
    with pytest.raises(InvalidArgumentError):
        other.release(buffer)


def test_bad_geometry_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        AlignedBufferPool(1000, 2)
    with pytest.raises(InvalidArgumentError):
        AlignedBufferPool(4096, 0)


def test_close_refuses_while_held_and_then_refuses_acquire() -> None:
    pool = AlignedBufferPool(4096, 2)
    buffer = pool.try_acquire()
    assert buffer is not None
    with pytest.raises(InvalidArgumentError):
        pool.close()
    buffer.release()
    pool.close()
    with pytest.raises(EngineClosedError):
        pool.try_acquire()


def test_acquire_waits_for_a_release_from_another_thread() -> None:
    pool = AlignedBufferPool(4096, 1)

    async def body() -> None:
        first = await pool.acquire()
        waiter = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.01)
        assert not waiter.done()  # waits, and the loop keeps running meanwhile
        threading.Timer(0.02, first.release).start()
        second = await asyncio.wait_for(waiter, 5)
        assert second is first
        second.release()

    asyncio.run(body())


def test_cancelled_waiter_does_not_strand_a_buffer() -> None:
    pool = AlignedBufferPool(4096, 1)

    async def body() -> None:
        first = await pool.acquire()
        cancelled = asyncio.ensure_future(pool.acquire())
        patient = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0.01)
        cancelled.cancel()
        first.release()
        got = await asyncio.wait_for(patient, 5)
        got.release()

    asyncio.run(body())
