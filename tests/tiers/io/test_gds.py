"""GdsEngine: refuses clearly where it cannot run; round-trips CUDA tensors where it can.

The round-trip tests are marked ``gpu`` and skip themselves without CUDA and kvikio; they have
never run on hardware (see the GdsEngine docstring). The construction tests run everywhere.
"""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiers import (
    EngineUnavailableError,
    ReadRequest,
    StorageError,
    UnexpectedEOFError,
    WriteRequest,
    create_engine,
)
from tiers.io.gds import GdsEngine


def _cuda_and_kvikio() -> str | None:
    """None when the GPU tests can run here, else why not."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "CUDA is not available (no GPU or no driver)"
    if importlib.util.find_spec("kvikio") is None:
        return "kvikio is not installed (pip install 'tierkit[gds]')"
    return None


_SKIP_GPU = _cuda_and_kvikio()


def _run(body: Any) -> Any:
    async def main() -> Any:
        async with GdsEngine() as engine:
            return await body(engine)

    return asyncio.run(main())


# ----------------------------------------------------------------- runs everywhere
def test_construction_without_cuda_or_kvikio_is_refused_with_a_reason() -> None:
    if _SKIP_GPU is None:
        pytest.skip("CUDA and kvikio are both present here")
    with pytest.raises(EngineUnavailableError) as info:
        GdsEngine()
    assert info.value.backend == "gds"
    assert info.value.reason and ("CUDA" in info.value.reason or "kvikio" in info.value.reason)
    with pytest.raises(EngineUnavailableError):
        create_engine("gds")


def test_missing_kvikio_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "kvikio", None)  # makes `import kvikio` fail
    with pytest.raises(EngineUnavailableError) as info:
        GdsEngine()
    assert "kvikio is not installed" in info.value.reason


def test_missing_torch_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(EngineUnavailableError) as info:
        GdsEngine()
    assert "torch is not installed" in info.value.reason


def test_importing_the_module_imports_no_backend() -> None:
    code = "import sys, tiers.io.gds; print('torch' in sys.modules, 'kvikio' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.split() == ["False", "False"]  # only constructing an engine imports them


class _FakeFuture:
    def __init__(self, result: int) -> None:
        self._result = result

    def get(self) -> int:
        return self._result


class _FakeCuFile:
    """Host-only stand-in for kvikio.CuFile with KvikIO's EOF behaviour (it raises)."""

    def __init__(self, path: str, flags: str) -> None:
        self.fd = os.open(path, os.O_RDWR if "+" in flags else os.O_RDONLY)

    def pread(self, buf: Any, size: int, file_offset: int) -> _FakeFuture:
        data = os.pread(self.fd, size, file_offset)
        if len(data) < size:
            raise RuntimeError("POSIX error on pread: EOF")
        memoryview(buf).cast("B")[:size] = data
        return _FakeFuture(size)

    def pwrite(self, buf: Any, size: int, file_offset: int) -> _FakeFuture:
        if file_offset == 666:
            raise RuntimeError("cuFile: simulated failure")
        return _FakeFuture(os.pwrite(self.fd, memoryview(buf).cast("B")[:size], file_offset))

    def close(self) -> None:
        os.close(self.fd)


def test_engine_plumbing_with_a_fake_kvikio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Batching, EOF clipping, the waiter thread, errors and close, on host buffers: everything
    but the GPU itself, so this much of GdsEngine is exercised without hardware."""
    torch = pytest.importorskip("torch")
    fake = types.ModuleType("kvikio")
    fake.CuFile = _FakeCuFile  # type: ignore[attr-defined]
    fake.defaults = types.SimpleNamespace(get=lambda name: "fake")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvikio", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    content = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    path = tmp_path / "fake.bin"

    async def body(engine: GdsEngine) -> None:
        file = await engine.open(path, create=True)
        assert await engine.write_from(file, 0, content) == len(content)
        await engine.fsync(file, datasync=True)
        buffer = bytearray(b"\xaa" * 4096)
        assert await engine.read_into(file, 8000, buffer) == 2000  # clipped at EOF, not raised
        assert bytes(buffer[:2000]) == content[8000:] and buffer[2000:] == b"\xaa" * 2096
        target = np.zeros(3 * 1000, np.uint8)
        results = await engine.read_batch(file, target, [0, 5000, 9500], 1000)
        assert results.tolist() == [1000, 1000, 500]
        assert target[:1000].tobytes() == content[:1000]
        assert target[1000:2000].tobytes() == content[5000:6000]
        with pytest.raises(UnexpectedEOFError):
            await engine.read_exactly_into(file, 9000, bytearray(2000))
        with pytest.raises(StorageError) as info:
            await engine.submit(
                [WriteRequest(file, 666, b"x"), ReadRequest(file, 100, bytearray(10))]
            )
        assert info.value.errno == errno.EIO and "simulated failure" in str(info.value)
        assert info.value.batch_results == [info.value, 10]
        assert engine.stats()["kvikio_compat_mode"] == "fake"

    _run(body)
    assert path.read_bytes() == content


# ----------------------------------------------------------------- needs a CUDA machine
@pytest.mark.gpu
@pytest.mark.skipif(_SKIP_GPU is not None, reason=f"GDS: {_SKIP_GPU}")
def test_cuda_tensor_round_trip(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "gds.bin"
    source = torch.arange(1 << 20, dtype=torch.int32, device="cuda") * 7

    async def body(engine: GdsEngine) -> None:
        file = await engine.open(path, create=True)
        assert await engine.write_from(file, 4096, source) == source.nbytes
        await engine.fsync(file)
        target = torch.zeros_like(source)
        assert await engine.read_into(file, 4096, target) == source.nbytes
        assert torch.equal(target, source)
        # past end of file: a short read, not an error
        tail = torch.full((2048,), -1, dtype=torch.int32, device="cuda")
        done = await engine.read_into(file, 4096 + source.nbytes - 4096, tail)
        assert done == 4096
        assert torch.equal(tail[:1024], source[-1024:]) and bool((tail[1024:] == -1).all())
        with pytest.raises(UnexpectedEOFError):
            await engine.read_exactly_into(file, 4096 + source.nbytes - 4096, tail)
        assert engine.stats()["bytes_written"] == source.nbytes

    _run(body)
    on_disk = np.frombuffer(path.read_bytes()[4096:], np.int32)
    assert np.array_equal(on_disk, source.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.skipif(_SKIP_GPU is not None, reason=f"GDS: {_SKIP_GPU}")
def test_batched_slices_of_one_cuda_buffer_and_host_buffers(tmp_path: Path) -> None:
    import torch

    content = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "batch.bin"
    path.write_bytes(content.tobytes())
    offsets = np.array([0, 65536, 12345, 900_000], np.int64)

    async def body(engine: GdsEngine) -> tuple[np.ndarray, bytes]:
        file = await engine.open(path)
        buffer = torch.zeros(4 * 8192, dtype=torch.uint8, device="cuda")
        results = await engine.read_batch(file, buffer, offsets, 8192)
        host = bytearray(1000)
        assert await engine.read_into(file, 500, host) == 1000
        assert bytes(host) == content[500:1500].tobytes()
        return results, buffer.cpu().numpy().tobytes()

    results, got = _run(body)
    assert results.tolist() == [8192] * 4
    for i, offset in enumerate(offsets.tolist()):
        assert got[i * 8192 : (i + 1) * 8192] == content[offset : offset + 8192].tobytes()
