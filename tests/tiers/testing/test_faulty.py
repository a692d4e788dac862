"""FaultyEngine: injected EIO / ENOSPC / short reads keep the batch contract; power cuts restore
exactly the last-fsynced image. Every test runs over ThreadEngine and UringEngine as inner."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiers import (
    EngineClosedError,
    InvalidArgumentError,
    NoSpaceError,
    ReadRequest,
    StorageError,
    ThreadEngine,
    UnexpectedEOFError,
    UringEngine,
    WriteRequest,
)
from tiers.io import IOBatch, IOEngine
from tiers.testing.engine_contract import EngineContract
from tiers.testing.faulty_engine import FaultyEngine

_URING_REASON = UringEngine.probe()
INNER = [
    pytest.param("thread", id="thread"),
    pytest.param(
        "uring",
        id="uring",
        marks=[
            pytest.mark.uring,
            pytest.mark.skipif(_URING_REASON is not None, reason=f"io_uring: {_URING_REASON}"),
        ],
    ),
]


def _data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _run(inner_kind: str, body: Callable[[FaultyEngine], Awaitable[Any]], **knobs: Any) -> Any:
    async def main() -> Any:
        inner = ThreadEngine(8) if inner_kind == "thread" else UringEngine(32)
        engine = FaultyEngine(inner, **knobs)
        try:
            return await body(engine)
        finally:
            await engine.aclose()

    return asyncio.run(main())


def _file(tmp_path: Path, content: bytes, name: str = "f.bin") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("inner", INNER)
def test_no_faults_is_a_plain_engine(tmp_path: Path, inner: str) -> None:
    path = tmp_path / "plain.bin"
    payload = _data(20_000, 1)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, create=True)
        assert await engine.write_from(file, 100, payload) == len(payload)
        buffer = bytearray(len(payload) + 50)
        assert await engine.read_into(file, 100, buffer) == len(payload)  # EOF after payload
        assert bytes(buffer[: len(payload)]) == payload
        assert engine.file_size(file) == 100 + len(payload)
        assert not engine.injected

    _run(inner, body)


@pytest.mark.parametrize("inner", INNER)
def test_eio_on_a_read_fails_only_that_request(tmp_path: Path, inner: str) -> None:
    content = _data(12_288, 2)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        engine.fail_next("eio_read")
        first, second = bytearray(b"\xaa" * 4096), bytearray(4096)
        new = _data(4096, 3)
        requests = [
            WriteRequest(file, 0, new),  # not a read: untouched by the trigger
            ReadRequest(file, 4096, first),  # the first read: fails
            ReadRequest(file, 8192, second),  # still runs to completion
        ]
        with pytest.raises(StorageError) as info:
            await engine.submit(requests)
        error = info.value
        assert error.errno == errno.EIO and not isinstance(error, NoSpaceError)
        assert error.filename == str(path) and error.offset_bytes == 4096
        assert error.batch_results == [4096, error, 4096]
        assert first == b"\xaa" * 4096  # the failed read never touched its buffer
        assert bytes(second) == content[8192:]
        assert engine.injected == {"eio_read": 1}

    _run(inner, body)
    assert path.read_bytes()[:4096] == _data(4096, 3)


@pytest.mark.parametrize("inner", INNER)
def test_enospc_write_does_not_happen(tmp_path: Path, inner: str) -> None:
    content = _data(16_384, 4)
    path = _file(tmp_path, content)
    chunks = [_data(4096, 10 + i) for i in range(4)]

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        engine.fail_next("enospc", count=2)
        with pytest.raises(NoSpaceError) as info:
            await engine.submit([WriteRequest(file, i * 4096, c) for i, c in enumerate(chunks)])
        error = info.value
        assert error.errno == errno.ENOSPC and error.offset_bytes == 0
        assert error.batch_results is not None
        assert error.batch_results[0] is error
        assert isinstance(error.batch_results[1], NoSpaceError)
        assert error.batch_results[1].offset_bytes == 4096
        assert error.batch_results[2:] == [4096, 4096]
        # triggers are spent: the next write goes through
        assert await engine.write_from(file, 0, chunks[0]) == 4096

    _run(inner, body)
    assert path.read_bytes() == chunks[0] + content[4096:8192] + chunks[2] + chunks[3]


@pytest.mark.parametrize("inner", INNER)
def test_eio_write_does_not_happen(tmp_path: Path, inner: str) -> None:
    content = _data(8192, 5)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        engine.fail_next("eio")  # the next read or write
        with pytest.raises(StorageError) as info:
            await engine.write_from(file, 4096, b"\x01" * 4096)
        assert info.value.errno == errno.EIO and info.value.offset_bytes == 4096
        assert info.value.batch_results == [info.value]
        assert engine.injected == {"eio_write": 1}

    _run(inner, body)
    assert path.read_bytes() == content


@pytest.mark.parametrize("inner", INNER)
def test_short_read_returns_a_prefix_and_leaves_the_rest(tmp_path: Path, inner: str) -> None:
    content = _data(16_384, 6)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path)
        engine.fail_next("short_read", short_bytes=1000)
        buffer = np.full(4096, 0xAA, np.uint8)
        assert await engine.read_into(file, 2048, buffer) == 1000
        assert buffer[:1000].tobytes() == content[2048:3048]
        assert (buffer[1000:] == 0xAA).all()
        engine.fail_next("short_read")  # default: half the request
        results = await engine.read_batch(file, np.zeros(3 * 4096, np.uint8), [0, 4096, 8192], 4096)
        assert results.tolist() == [2048, 4096, 4096]
        engine.fail_next("short_read", short_bytes=10)
        with pytest.raises(UnexpectedEOFError) as info:
            await engine.read_exactly_into(file, 0, bytearray(100))
        assert info.value.offset_bytes == 10
        assert engine.injected == {"short_read": 3}

    _run(inner, body)


@pytest.mark.parametrize("inner", INNER)
def test_short_read_on_o_direct_stays_aligned(tmp_path: Path, inner: str) -> None:
    from tiers import DirectIOUnsupportedError, aligned_empty

    content = _data(4 * 4096, 7)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        try:
            file = await engine.open(path, direct=True)
        except DirectIOUnsupportedError:
            pytest.skip("the filesystem of tmp_path refuses O_DIRECT")
        engine.fail_next("short_read", short_bytes=5000)
        buffer = aligned_empty(3 * 4096)
        assert await engine.read_into(file, 4096, buffer) == 4096  # 5000 rounded down
        assert buffer[:4096].tobytes() == content[4096:8192]

    _run(inner, body)


@pytest.mark.parametrize("inner", INNER)
def test_rates_are_seeded_and_the_rest_of_the_batch_is_exact(tmp_path: Path, inner: str) -> None:
    content = _data(200 * 512, 8)
    path = _file(tmp_path, content)
    offsets = np.arange(200) * 512

    async def body(engine: FaultyEngine) -> tuple[list[Any], bytes]:
        file = await engine.open(path)
        buffer = np.zeros(200 * 512, np.uint8)
        with pytest.raises(StorageError) as info:
            await engine.read_batch(file, buffer, offsets, 512)
        outcome = info.value.batch_results
        assert outcome is not None
        return outcome, buffer.tobytes()

    outcomes = []
    for _ in range(2):
        outcome, got = _run(inner, body, seed=42, eio_rate=0.3, short_read_rate=0.2)
        failed = [i for i, r in enumerate(outcome) if isinstance(r, BaseException)]
        short = [i for i, r in enumerate(outcome) if isinstance(r, int) and r < 512]
        assert 20 < len(failed) < 100 and 10 < len(short) < 60
        for i, result in enumerate(outcome):
            if isinstance(result, int):
                span = slice(i * 512, i * 512 + result)
                assert got[span] == content[span]
            else:
                assert result.errno == errno.EIO and result.offset_bytes == i * 512
        outcomes.append([r if isinstance(r, int) else "eio" for r in outcome])
    assert outcomes[0] == outcomes[1]  # same seed, same faults


@pytest.mark.parametrize("inner", INNER)
def test_power_cut_restores_the_last_fsynced_image(tmp_path: Path, inner: str) -> None:
    rng = random.Random(9)
    main_path, fresh_path = tmp_path / "main.bin", tmp_path / "fresh.bin"

    async def body(engine: FaultyEngine) -> tuple[bytes, bytes]:
        file = await engine.open(main_path, create=True)
        current = bytearray()
        durable = b""
        for step in range(60):
            if rng.random() < 0.2:
                await engine.fsync(file, datasync=step % 2 == 0)
                durable = bytes(current)
                continue
            offset = rng.randrange(0, len(current) + 3000)
            payload = rng.randbytes(rng.randrange(1, 5000))
            await engine.write_from(file, offset, payload)
            if offset > len(current):
                current.extend(bytes(offset - len(current)))
            current[offset : offset + len(payload)] = payload
        assert main_path.read_bytes() == bytes(current)
        await engine.close_file(file)  # closing does not make anything durable
        fresh = await engine.open(fresh_path, create=True)
        await engine.write_from(fresh, 0, b"never synced")
        report = await engine.power_cut()
        assert not report.kept and report.dropped
        return durable, bytes(current)

    durable, before = _run(inner, body)
    assert durable != before  # the random walk did end with unsynced writes
    assert main_path.read_bytes() == durable
    assert fresh_path.read_bytes() == b""


@pytest.mark.parametrize("inner", INNER)
def test_power_cut_random_keeps_whole_writes(tmp_path: Path, inner: str) -> None:
    synced = _data(10 * 4096, 11)
    path = _file(tmp_path, b"")
    writes = [(slot * 2048 + 100, _data(1500, 100 + slot)) for slot in range(0, 30, 2)]

    async def body(engine: FaultyEngine) -> Any:
        file = await engine.open(path, write=True)
        await engine.write_from(file, 0, synced)
        await engine.fsync(file)
        for offset, payload in writes:  # 15 disjoint writes, the last ones past the synced end
            await engine.write_from(file, offset, payload)
        return await engine.power_cut(keep="random")

    report = _run(inner, body, seed=3)
    key = os.path.realpath(path)
    kept = set(report.kept.get(key, []))
    assert kept and len(kept) < len(writes)  # seed 3 keeps some and drops some
    assert sorted(kept | set(report.dropped[key])) == [(o, len(p)) for o, p in writes]
    got = path.read_bytes()
    assert len(got) == max([len(synced), *(o + n for o, n in kept)])
    image = synced + bytes(max(0, len(got) - len(synced)))  # synced bytes, zeros past its end
    for offset, payload in writes:
        region = got[offset : offset + len(payload)]
        if (offset, len(payload)) in kept:
            assert region == payload
        else:
            assert region == image[offset : offset + len(payload)]
    untouched = bytearray(got)
    for offset, payload in writes:
        untouched[offset : offset + len(payload)] = image[offset : offset + len(payload)]
    assert bytes(untouched) == image[: len(got)]


@pytest.mark.parametrize("inner", INNER)
def test_failed_fsync_makes_nothing_durable(tmp_path: Path, inner: str) -> None:
    content = _data(8192, 12)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        await engine.write_from(file, 0, b"\x00" * 9000)
        engine.fail_next("eio_fsync")
        with pytest.raises(StorageError) as info:
            await engine.fsync(file)
        assert info.value.errno == errno.EIO
        await engine.power_cut()

    _run(inner, body)
    assert path.read_bytes() == content


@pytest.mark.parametrize("inner", INNER)
def test_engine_is_dead_after_a_power_cut(tmp_path: Path, inner: str) -> None:
    path = _file(tmp_path, b"x" * 100)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        await engine.power_cut()
        assert engine.closed and engine.inner.closed
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: engine.open(path),
            lambda: engine.read_into(file, 0, bytearray(10)),
            lambda: engine.write_from(file, 0, b"y"),
            lambda: engine.fsync(file),
            lambda: engine.close_file(file),
            lambda: engine.power_cut(),
        ]
        for call in calls:  # I/O on its files may be refused as "file closed" first
            with pytest.raises(EngineClosedError):
                await call()
        with pytest.raises(EngineClosedError, match="lost power"):
            await engine.run(IOBatch.for_sync(file, False))
        with pytest.raises(EngineClosedError):
            engine.file_size(file)
        await engine.aclose()  # closing a dead engine is a no-op

    _run(inner, body)
    assert path.read_bytes() == b"x" * 100


@pytest.mark.parametrize("inner", INNER)
def test_faults_in_one_batch_leave_concurrent_batches_alone(tmp_path: Path, inner: str) -> None:
    content = _data(64 * 1024, 13)
    path = _file(tmp_path, content)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path)
        buffers = [np.zeros(16 * 1024, np.uint8) for _ in range(4)]
        engine.fail_next("eio_read")
        tasks = [engine.read_into(file, i * 16 * 1024, b) for i, b in enumerate(buffers)]
        outcome = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(outcome[0], StorageError) and outcome[1:] == [16 * 1024] * 3
        for i in range(1, 4):
            assert buffers[i].tobytes() == content[i * 16 * 1024 : (i + 1) * 16 * 1024]

    _run(inner, body)


def test_bad_arguments_are_refused() -> None:
    inner = ThreadEngine(2)
    with pytest.raises(InvalidArgumentError):
        FaultyEngine(inner, eio_rate=1.5)
    engine = FaultyEngine(inner)
    with pytest.raises(InvalidArgumentError):
        engine.fail_next("bogus")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        engine.fail_next("eio", short_bytes=3)
    with pytest.raises(InvalidArgumentError):
        asyncio.run(engine.power_cut(keep="some"))  # type: ignore[arg-type]
    asyncio.run(engine.aclose())


@pytest.mark.parametrize("inner", INNER)
def test_truncating_open_is_durable_and_cancelled_callers_still_log(
    tmp_path: Path, inner: str
) -> None:
    path = _file(tmp_path, _data(8192, 14))
    key = os.path.realpath(path)
    payload = _data(4096, 15)

    async def body(engine: FaultyEngine) -> None:
        file = await engine.open(path, write=True)
        await engine.write_from(file, 0, b"\xff" * 100)  # unsynced, then truncated away
        await engine.close_file(file)
        file = await engine.open(path, truncate=True)
        await engine.write_from(file, 0, payload)
        await engine.fsync(file)
        task = asyncio.ensure_future(engine.write_from(file, 4096, payload))
        await asyncio.sleep(0)
        task.cancel()  # the write itself still runs to completion and is logged
        with pytest.raises(asyncio.CancelledError):
            await task
        report = await engine.power_cut()
        assert report.dropped == {key: [(4096, 4096)]}

    _run(inner, body)
    assert path.read_bytes() == payload


class TestFaultyEngineWithoutFaultsKeepsTheContract(EngineContract):
    """A FaultyEngine with every fault off is just its inner engine: the contract holds."""

    def make_engine(self, queue_depth: int = 32) -> IOEngine:
        return FaultyEngine(ThreadEngine(queue_depth))
