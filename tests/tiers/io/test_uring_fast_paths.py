"""UringEngine's compiled reap-and-refill loop and its gathered single-request path give the
same bytes, results and typed errors as the Python path, and close cleanly with I/O in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tiers.io import aligned_empty
from tiers.io.errors import EngineClosedError, StorageError
from tiers.io.uring.compiled_drive import _load
from tiers.io.uring.engine import UringEngine
from tiers.testing.engine_contract import run

pytestmark = pytest.mark.uring
SIZE = 1 << 20


def _data_file(tmp_path: Path, size: int = SIZE) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(11).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    return path, data


def _engine(compiled: bool, queue_depth: int = 8) -> UringEngine:
    engine = UringEngine(queue_depth)
    if not compiled:
        engine._ensure_ring = _without_compiled(engine)  # type: ignore[method-assign]
    return engine


def _without_compiled(engine: UringEngine):  # type: ignore[no-untyped-def]
    original = engine._ensure_ring

    def ensure():  # type: ignore[no-untyped-def]
        ring = original()
        engine._compiled = None
        return ring

    return ensure


@pytest.mark.parametrize("direct", [False, True])
def test_compiled_batches_match_the_python_path(tmp_path: Path, direct: bool) -> None:
    if _load() is None:
        pytest.skip("numba is not available here: only the Python path runs")
    path, data = _data_file(tmp_path)
    # 700 rows at QD8: many refills, two batches interleaved, a tail that reaches EOF (short)
    offsets = np.random.default_rng(3).integers(0, SIZE // 4096, 700) * 4096
    offsets[-1] = SIZE - 4096 if direct else SIZE - 100

    async def body(compiled: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        engine = _engine(compiled)
        file = await engine.open(path, direct=direct)
        assert (engine._compiled is not None) == compiled
        one, two = aligned_empty(700 * 4096), aligned_empty(300 * 4096)
        one[:], two[:] = 0, 0  # the bytes past EOF stay as they were
        got = await asyncio.gather(
            engine.read_batch(file, one, offsets, 4096),
            engine.read_batch(file, two, offsets[::-1][:300].copy(), 4096),
        )
        await engine.aclose()
        return one, two, got[0], got[1]

    fast, slow = run(lambda: body(True)), run(lambda: body(False))
    for a, b in zip(fast, slow, strict=True):
        assert np.array_equal(a, b)
    one, _, results, _ = fast
    for i, off in enumerate(offsets.tolist()):
        n = int(results[i])
        assert n == min(4096, SIZE - off)
        assert np.array_equal(one[i * 4096 : i * 4096 + n], data[off : off + n])


@pytest.mark.parametrize("compiled", [True, False])
def test_concurrent_singles_share_submissions(tmp_path: Path, compiled: bool) -> None:
    path, data = _data_file(tmp_path)
    pushes: list[int] = []

    async def body() -> list[int]:
        engine = _engine(compiled, queue_depth=16)
        file = await engine.open(path)
        original, dequeue = engine._push, engine._dequeue_singles

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            pushes.append(len(args[4]))
            original(*args, **kwargs)

        def dequeue_spy(count: int) -> None:  # the compiled loop wrote ``count`` of them
            if compiled:
                pushes.append(count)
            dequeue(count)

        engine._push = spy  # type: ignore[method-assign]
        engine._dequeue_singles = dequeue_spy  # type: ignore[method-assign]
        buffers = [bytearray(4000) for _ in range(64)]
        offsets = [i * 16384 + 7 for i in range(64)]
        got = await asyncio.gather(
            *(engine.read_into(file, o, b) for o, b in zip(offsets, buffers, strict=True))
        )
        for o, b in zip(offsets, buffers, strict=True):
            assert bytes(b) == data[o : o + 4000].tobytes()
        await engine.aclose()
        return list(got)

    got = run(body)
    assert got[:64] == [4000] * 64
    assert max(pushes) > 1, "singles were written to the ring one by one"
    assert sum(pushes) == 64


@pytest.mark.parametrize("compiled", [True, False])
def test_single_errors_eof_and_writes(tmp_path: Path, compiled: bool) -> None:
    path, data = _data_file(tmp_path, 10_000)

    async def body() -> None:
        engine = _engine(compiled)
        file = await engine.open(path, write=True)
        directory = await engine.open(tmp_path)
        tail, bad = bytearray(4096), bytearray(8)
        outcomes = await asyncio.gather(
            engine.read_into(file, 8192, tail),  # 1808 bytes, then EOF
            engine.read_into(directory, 0, bad),  # EISDIR, typed
            engine.write_from(file, 100, b"abc"),
            return_exceptions=True,
        )
        assert outcomes[0] == 10_000 - 8192
        assert bytes(tail[:1808]) == data[8192:].tobytes()
        error = outcomes[1]
        assert isinstance(error, StorageError) and error.errno == 21
        assert error.filename == str(tmp_path)
        assert outcomes[2] == 3
        assert engine.stats()["errors"] == 1
        await engine.aclose()
        with pytest.raises(EngineClosedError):
            await engine.read_into(file, 0, bytearray(1))

    run(body)
    assert path.read_bytes()[100:103] == b"abc"


@pytest.mark.parametrize("compiled", [True, False])
def test_short_single_read_is_resumed(tmp_path: Path, compiled: bool) -> None:
    path, data = _data_file(tmp_path)

    async def body() -> int:
        engine = _engine(compiled)
        file = await engine.open(path)
        engine._ensure_ring()
        # a registered buffer sends singles through the Python ``_push`` (the compiled loop
        # fills only queues without one), where the fault below is planted
        await engine.register_buffers([aligned_empty(4096)])
        original = engine._single_unusual
        real_push = engine._push
        cut = [True]

        def short_push(word0, off, addr, word3, slots, word5, lengths, done):  # type: ignore[no-untyped-def]
            # the first SQE asks for the whole buffer but only 1000 bytes reach the kernel:
            # the engine sees a short read (as from a signal) and must resume it
            if cut[0]:
                cut[0] = False
                word3 = np.array([1000], np.int64)
            real_push(word0, off, addr, word3, slots, word5, lengths, done)

        engine._push = short_push  # type: ignore[method-assign]
        seen: list[int] = []

        def spy(slot: int, result: int) -> None:
            seen.append(result)
            original(slot, result)

        engine._single_unusual = spy  # type: ignore[method-assign]
        buffer = bytearray(5000)
        n = await engine.read_into(file, 3, buffer)
        assert bytes(buffer) == data[3:5003].tobytes()
        assert seen == [1000] and engine.stats()["short_transfers_resumed"] == 1
        await engine.aclose()
        return n

    assert run(body) == 5000


@pytest.mark.parametrize("compiled", [True, False])
def test_uniform_singles_reach_eof_and_errors(tmp_path: Path, compiled: bool) -> None:
    """Singles of one file and op (the queue the compiled loop writes itself): a read cut by
    EOF is resumed and ends short, one past EOF gives 0, and a failing file raises typed."""
    path, data = _data_file(tmp_path, 10_000)

    async def body() -> None:
        engine = _engine(compiled)
        file = await engine.open(path)
        buffers = [bytearray(4096) for _ in range(4)]
        offsets = (0, 8192, 12288, 4096)
        got = await asyncio.gather(
            *(engine.read_into(file, o, b) for o, b in zip(offsets, buffers, strict=True))
        )
        assert got == [4096, 10_000 - 8192, 0, 4096]
        assert bytes(buffers[1][: got[1]]) == data[8192:].tobytes()
        assert bytes(buffers[3]) == data[4096:8192].tobytes()
        assert engine.stats()["short_transfers_resumed"] == 1
        directory = await engine.open(tmp_path)
        outcomes = await asyncio.gather(
            *(engine.read_into(directory, 0, bytearray(8)) for _ in range(3)),
            return_exceptions=True,
        )
        assert all(isinstance(e, StorageError) and e.errno == 21 for e in outcomes)
        assert engine.stats()["errors"] == 3
        await engine.aclose()
        assert engine._inflight == 0 and not engine._single_recs

    run(body)


@pytest.mark.parametrize("compiled", [True, False])
def test_close_with_singles_and_batches_in_flight(tmp_path: Path, compiled: bool) -> None:
    path, data = _data_file(tmp_path)

    async def body() -> None:
        engine = _engine(compiled, queue_depth=4)
        file = await engine.open(path, direct=True)
        buffers = [aligned_empty(4096) for _ in range(20)]
        big = aligned_empty(64 * 4096)
        work = [
            asyncio.ensure_future(engine.read_into(file, i * 4096, b))
            for i, b in enumerate(buffers)
        ]
        work.append(asyncio.ensure_future(engine.read_batch(file, big, np.arange(64) * 4096, 4096)))
        await asyncio.sleep(0)
        await engine.aclose()  # waits for every accepted request
        assert all(w.done() for w in work)
        for i, b in enumerate(buffers):
            assert np.array_equal(b, data[i * 4096 : (i + 1) * 4096])
        assert np.array_equal(big, data[: 64 * 4096])
        assert engine._inflight == 0 and engine._nfree == 4 and not engine._single_recs

    run(body)


def test_compiled_loop_refills_before_handing_back(tmp_path: Path) -> None:
    if _load() is None:
        pytest.skip("numba is not available here: only the Python path runs")
    path, data = _data_file(tmp_path)

    async def body() -> None:
        engine = _engine(True, queue_depth=8)
        file = await engine.open(path, direct=True)  # completions come later, not inline
        small, big = aligned_empty(16 * 4096), aligned_empty(200 * 4096)
        offsets = np.arange(200, dtype=np.int64) * 4096
        rest = asyncio.ensure_future(engine.read_batch(file, big, offsets[::-1].copy(), 4096))
        await engine.read_batch(file, small, offsets[:16], 4096)
        # the small batch's caller runs here: the slots its last wave freed already hold
        # rows of the big batch, so the device is not left short while Python runs
        left = len(engine._pending[0][0]) - engine._pending[0][1] if engine._pending else 0
        assert left > 0, "the big batch ran out of rows: the check below proves nothing"
        assert engine._inflight == 8
        await rest
        assert np.array_equal(small, data[: 16 * 4096])
        assert np.array_equal(big.reshape(200, 4096), data[: 200 * 4096].reshape(200, 4096)[::-1])
        await engine.aclose()

    run(body)
