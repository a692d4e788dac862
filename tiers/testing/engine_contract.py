"""EngineContract: the one test suite every IOEngine must pass (subclass it per engine).

Shipped in the package so third-party engines can run it too::

    class TestMyEngine(EngineContract):
        def make_engine(self, queue_depth: int = 32) -> IOEngine:
            return MyEngine(queue_depth)

Each test is a plain function driving its own event loop (engines are loop-bound). Oracles are
``os.pread`` and a bytearray model of the file, never the engine under test.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiers.io.batch import ReadRequest, WriteRequest
from tiers.io.buffers import aligned_empty
from tiers.io.engine import IOEngine
from tiers.io.errors import (
    AlignmentError,
    EngineClosedError,
    FileMissingError,
    InvalidArgumentError,
    StorageError,
    UnexpectedEOFError,
)

__all__ = ["EngineContract", "run"]

T = TypeVar("T")
FILE_SIZE_BYTES = 1 << 20
_HYPOTHESIS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


def run(factory: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine on a fresh event loop."""

    async def main() -> T:
        return await factory()

    return asyncio.run(main())


def _random_file(directory: Path, size_bytes: int = FILE_SIZE_BYTES, seed: int = 7) -> Path:
    path = directory / f"data-{seed}.bin"
    data = np.random.default_rng(seed).integers(0, 256, size_bytes, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    return path


def _pread(path: Path, offset_bytes: int, size_bytes: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size_bytes, offset_bytes)
    finally:
        os.close(fd)


class EngineContract(abc.ABC):
    """Behaviour every engine shares; see the semantics in :mod:`tiers.io.engine`."""

    direct_io = True  # set False for an engine whose filesystem has no O_DIRECT

    @abc.abstractmethod
    def make_engine(self, queue_depth: int = 32) -> IOEngine:
        """A new engine of the kind under test."""

    async def _with_engine(
        self, body: Callable[[IOEngine], Awaitable[T]], queue_depth: int = 32
    ) -> T:
        engine = self.make_engine(queue_depth)
        try:
            return await body(engine)
        finally:
            await engine.aclose()

    def go(self, body: Callable[[IOEngine], Awaitable[T]], queue_depth: int = 32) -> T:
        return run(lambda: self._with_engine(body, queue_depth))

    # --------------------------------------------------------------- round trips
    @_HYPOTHESIS
    @given(
        st.lists(
            st.tuples(st.integers(0, FILE_SIZE_BYTES + 100), st.integers(0, 70_000)),
            min_size=1,
            max_size=24,
        )
    )
    def test_reads_match_pread(self, tmp_path: Path, spans: list[tuple[int, int]]) -> None:
        path = tmp_path / "data-7.bin"
        if not path.exists():
            _random_file(tmp_path)
        buffers = [np.full(size, 0xAB, np.uint8) for _, size in spans]

        async def body(engine: IOEngine) -> list[int]:
            file = await engine.open(path)
            return await engine.submit(
                [ReadRequest(file, off, buf) for (off, _), buf in zip(spans, buffers, strict=True)]
            )

        results = self.go(body)
        for (offset, size), buf, got in zip(spans, buffers, results, strict=True):
            expected = _pread(path, offset, size)
            assert got == len(expected)
            assert buf[:got].tobytes() == expected
            assert (buf[got:] == 0xAB).all()  # nothing written past EOF

    @_HYPOTHESIS
    @given(
        st.lists(
            st.tuples(st.integers(0, 200_000), st.binary(min_size=0, max_size=9000)),
            min_size=1,
            max_size=16,
        )
    )
    def test_writes_match_model(self, tmp_path: Path, writes: list[tuple[int, bytes]]) -> None:
        path = tmp_path / "w.bin"
        path.write_bytes(b"")
        model = bytearray()
        for offset, data in writes:  # sequential batches, so overlaps have a defined order
            end = offset + len(data)
            if data:
                model.extend(b"\0" * max(0, end - len(model)))
                model[offset:end] = data

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path, write=True)
            for offset, data in writes:
                assert await engine.write_from(file, offset, data) == len(data)
            await engine.fsync(file)

        self.go(body)
        assert path.read_bytes() == bytes(model)

    def test_buffer_kinds(self, tmp_path: Path) -> None:
        torch = pytest.importorskip("torch")
        path = _random_file(tmp_path)
        expected = _pread(path, 4096, 8192)
        targets: list[Any] = [
            bytearray(8192),
            np.zeros(2048, np.float32),
            memoryview(bytearray(8192)),
            torch.zeros(4096, dtype=torch.int16),
        ]

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            for target in targets:
                assert await engine.read_into(file, 4096, target) == 8192

        self.go(body)
        for target in targets:
            raw = target.numpy() if hasattr(target, "numpy") else np.asarray(target)
            assert raw.tobytes() == expected

    def test_zero_length_requests(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        direct = self.direct_io

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path, direct=direct)
            buffer = aligned_empty(4096)
            assert (await engine.read_batch(file, buffer, np.array([0, 4096]), 0) == 0).all()
            assert await engine.read_into(file, 0, buffer[:0]) == 0
            assert (await engine.read_batch(file, buffer, np.array([8192]), 4096) == 4096).all()

        self.go(body)

    def test_vectorised_batch_with_buffer_offsets(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        offsets = np.array([0, 12_288, 500_000, 4096], np.int64)
        slots = np.array([3 * 5000, 0, 5000, 2 * 5000], np.int64)
        buffer = np.zeros(4 * 5000, np.uint8)

        async def body(engine: IOEngine) -> np.ndarray:
            file = await engine.open(path)
            return await engine.read_batch(file, buffer, offsets, 5000, slots)

        assert self.go(body).tolist() == [5000] * 4
        for off, slot in zip(offsets, slots, strict=True):
            assert buffer[slot : slot + 5000].tobytes() == _pread(path, int(off), 5000)

    # --------------------------------------------------------------- O_DIRECT
    def test_direct_reads_and_writes(self, tmp_path: Path) -> None:
        if not self.direct_io:
            pytest.skip("engine runs without O_DIRECT here")
        path = _random_file(tmp_path)
        rng = np.random.default_rng(3)
        offsets = rng.integers(0, FILE_SIZE_BYTES // 4096, 64) * 4096
        buffer = aligned_empty(64 * 4096)
        payload = aligned_empty(3 * 4096)
        payload[:] = rng.integers(0, 256, payload.size, dtype=np.uint8)

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path, write=True, direct=True)
            assert (await engine.read_batch(file, buffer, offsets, 4096) == 4096).all()
            assert await engine.write_from(file, 8192, payload) == payload.size
            await engine.fsync(file, datasync=True)

        self.go(body)
        for i, off in enumerate(offsets.tolist()):
            if not 8192 <= off < 8192 + payload.size:
                assert buffer[i * 4096 : (i + 1) * 4096].tobytes() == _pread(path, off, 4096)
        assert _pread(path, 8192, payload.size) == payload.tobytes()

    @pytest.mark.parametrize("case", ["offset", "length", "address"])
    def test_misaligned_direct_request_is_refused_before_io(
        self, tmp_path: Path, case: str
    ) -> None:
        if not self.direct_io:
            pytest.skip("engine runs without O_DIRECT here")
        path = _random_file(tmp_path)
        base = aligned_empty(3 * 4096)
        offset, buffer = {
            "offset": (100, base[:4096]),
            "length": (0, base[:1000]),
            "address": (0, base[8:4104]),
        }[case]

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path, direct=True)
            with pytest.raises(AlignmentError, match="multiples of 4096"):
                await engine.read_into(file, offset, buffer)
            assert engine.stats()["requests"] == 0

        self.go(body)

    def test_direct_read_at_unaligned_eof(self, tmp_path: Path) -> None:
        if not self.direct_io:
            pytest.skip("engine runs without O_DIRECT here")
        path = _random_file(tmp_path, size_bytes=10_000)
        buffer = aligned_empty(16_384)

        async def body(engine: IOEngine) -> int:
            file = await engine.open(path, direct=True)
            return await engine.read_into(file, 0, buffer)

        assert self.go(body) == 10_000
        assert buffer[:10_000].tobytes() == path.read_bytes()

    # --------------------------------------------------------------- EOF and errors
    def test_eof_is_reported(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path, size_bytes=5000)

        async def body(engine: IOEngine) -> list[int]:
            file = await engine.open(path)
            results = await engine.submit(
                [
                    ReadRequest(file, 4000, bytearray(3000)),
                    ReadRequest(file, 9000, bytearray(10)),
                    ReadRequest(file, 0, bytearray(0)),
                ]
            )
            with pytest.raises(UnexpectedEOFError) as info:
                await engine.read_exactly_into(file, 4000, bytearray(3000))
            assert info.value.filename == str(path) and info.value.offset_bytes == 5000
            return results

        assert self.go(body) == [1000, 0, 0]

    def test_os_errors_are_typed_with_errno_and_path(self, tmp_path: Path) -> None:
        async def body(engine: IOEngine) -> None:
            with pytest.raises(FileMissingError) as info:
                await engine.open(tmp_path / "absent")
            assert info.value.errno == 2 and info.value.filename == str(tmp_path / "absent")
            directory = await engine.open(tmp_path)
            with pytest.raises(StorageError) as info2:
                await engine.read_into(directory, 0, bytearray(10))
            assert info2.value.errno == 21 and info2.value.filename == str(tmp_path)  # EISDIR

        self.go(body)

    def test_failed_request_does_not_stop_the_batch(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        good = [bytearray(4096) for _ in range(6)]

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            directory = await engine.open(tmp_path)
            requests = [ReadRequest(file, i * 4096, b) for i, b in enumerate(good)]
            requests.insert(3, ReadRequest(directory, 0, bytearray(8)))
            with pytest.raises(StorageError) as info:
                await engine.submit(requests)
            outcome = info.value.batch_results
            assert outcome is not None and isinstance(outcome[3], StorageError)
            assert [r for i, r in enumerate(outcome) if i != 3] == [4096] * 6

        self.go(body)
        for i, buf in enumerate(good):
            assert bytes(buf) == _pread(path, i * 4096, 4096)

    def test_bad_arguments(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            with pytest.raises(InvalidArgumentError):
                await engine.read_into(file, 0, b"read-only bytes")
            with pytest.raises(InvalidArgumentError):
                await engine.write_from(file, 0, b"not opened for writing")
            with pytest.raises(InvalidArgumentError):
                await engine.read_into(file, -1, bytearray(4))
            with pytest.raises(InvalidArgumentError):
                await engine.read_into(file, 0, np.zeros((4, 4), np.uint8)[:, 1])
            with pytest.raises(InvalidArgumentError):
                await engine.read_batch(file, bytearray(100), np.array([0, 50]), 60)
            with pytest.raises(InvalidArgumentError):
                await engine.submit(["not a request"])  # type: ignore[list-item]

        self.go(body)

    # --------------------------------------------------------------- concurrency
    def test_many_concurrent_batches(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        rng = np.random.default_rng(11)
        plans = [rng.integers(0, FILE_SIZE_BYTES - 5000, 40) for _ in range(25)]
        buffers = [np.zeros(40 * 5000, np.uint8) for _ in plans]

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            results = await asyncio.gather(
                *(
                    engine.read_batch(file, buf, plan, 5000)
                    for plan, buf in zip(plans, buffers, strict=True)
                )
            )
            assert all((r == 5000).all() for r in results)

        self.go(body, queue_depth=16)  # 1000 requests through 16 slots
        data = path.read_bytes()
        for plan, buf in zip(plans, buffers, strict=True):
            for i, off in enumerate(plan.tolist()):
                assert buf[i * 5000 : (i + 1) * 5000].tobytes() == data[off : off + 5000]

    def test_close_with_io_in_flight(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        buffers = [np.zeros(FILE_SIZE_BYTES, np.uint8) for _ in range(4)]
        offsets = np.arange(0, FILE_SIZE_BYTES, 4096)

        async def body() -> None:
            engine = self.make_engine(8)
            file = await engine.open(path)
            tasks = [
                asyncio.ensure_future(engine.read_batch(file, b, offsets, 4096)) for b in buffers
            ]
            await asyncio.sleep(0)
            await engine.aclose()  # waits for accepted batches
            assert all(t.done() for t in tasks)
            for task in tasks:
                assert (task.result() == 4096).all()
            with pytest.raises(EngineClosedError):
                await engine.read_into(file, 0, bytearray(10))
            with pytest.raises(EngineClosedError):
                await engine.open(path)

        run(body)
        for buf in buffers:
            assert buf.tobytes() == path.read_bytes()

    def test_cancelled_caller_leaves_engine_consistent(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)
        buffer = np.zeros(FILE_SIZE_BYTES, np.uint8)

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            task = asyncio.ensure_future(
                engine.read_batch(file, buffer, np.arange(0, FILE_SIZE_BYTES, 4096), 4096)
            )
            await asyncio.sleep(0)
            task.cancel()  # a no-op when the engine already finished the batch inline
            await asyncio.gather(task, return_exceptions=True)
            await engine.close_file(file)  # waits for the abandoned requests
            assert file.inflight == 0

        self.go(body)
        assert buffer.tobytes() == path.read_bytes()  # the I/O ran to completion

    def test_preallocate_holds_the_file_open_until_it_finishes(self, tmp_path: Path) -> None:
        path = tmp_path / "grown.dat"

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path, write=True, create=True)
            task = asyncio.ensure_future(engine.preallocate(file, 0, 1 << 20))
            await asyncio.sleep(0)
            closing = asyncio.ensure_future(engine.close_file(file))  # must wait for fallocate
            await asyncio.gather(task, closing)
            assert file.inflight == 0
            with pytest.raises(EngineClosedError):
                await engine.preallocate(file, 0, 4096)

        self.go(body)
        assert path.stat().st_size == 1 << 20

    def test_close_file_refuses_new_requests(self, tmp_path: Path) -> None:
        path = _random_file(tmp_path)

        async def body(engine: IOEngine) -> None:
            file = await engine.open(path)
            await engine.close_file(file)
            with pytest.raises(EngineClosedError):
                await engine.read_into(file, 0, bytearray(4))
            await engine.close_file(file)  # idempotent

        self.go(body)

    def test_stats_count_bytes(self, tmp_path: Path) -> None:
        path = tmp_path / "s.bin"

        async def body(engine: IOEngine) -> dict[str, Any]:
            file = await engine.open(path, create=True)
            await engine.submit([WriteRequest(file, 0, b"x" * 100)])
            await engine.read_into(file, 0, bytearray(60))
            return engine.stats()

        stats = self.go(body)
        assert stats["bytes_written"] == 100 and stats["bytes_read"] == 60
        assert stats["requests"] == 2 and stats["errors"] == 0
