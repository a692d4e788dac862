"""GdsEngine: optional GPUDirect Storage through RAPIDS KvikIO, reading into CUDA tensors.

UNTESTED ON HARDWARE. Written against the KvikIO 26.x Python API (``kvikio.CuFile``,
``pread/pwrite(buf, size, file_offset) -> IOFuture``) and checked only for its failure path:
KvikIO cannot even run in compat mode without ``libcuda.so.1`` (see
shared/research/io-core.md section 3), so on a GPU-less machine construction raises
:class:`~tiers.io.errors.EngineUnavailableError`. ``tests/tiers/io/test_gds.py`` holds the
round-trip tests to run on a CUDA machine with ``pip install tierkit[gds]``.

Buffers are contiguous torch CUDA tensors (or any object with ``__cuda_array_interface__``);
host buffers are accepted too. Each request becomes one ``CuFile.pread``/``pwrite`` on KvikIO's
own thread pool (``KVIKIO_NTHREADS``; ``queue_depth`` is not enforced here); one waiter thread
collects the futures of each batch in order and hands the batch back to the loop with
``call_soon_threadsafe``. KvikIO fails a read that meets end of file, so reads are clipped to the
file size taken when the batch starts (a concurrent append is not seen by that batch). torch
and kvikio are imported only when an engine is constructed.

Concurrency: loop-thread only, like every engine; the waiter thread touches only the rows of the
batch it is finishing. Pending GPU work is synchronised before a batch with device buffers is
issued, so a write sees the kernels that produced its tensor and a read races none reading it.
Invariants: every open FileHandle has exactly one CuFile; batches complete in submission order.
"""

from __future__ import annotations

import asyncio
import errno
import queue
import threading
from typing import Any

import numpy as np

from tiers.io.batch import FSYNC, READ, IOBatch
from tiers.io.buffers import BufferRef
from tiers.io.byte_views import is_tensor
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.env import Env
from tiers.io.errors import (
    EngineUnavailableError,
    InvalidArgumentError,
    StorageError,
    error_from_errno,
)

__all__ = ["GdsEngine"]

_STOP = None


def _load_backends() -> tuple[Any, Any]:
    """Import torch and kvikio, or say precisely why GDS cannot run here."""
    try:
        import torch
    except ImportError as exc:
        raise EngineUnavailableError("gds", f"torch is not installed ({exc})") from exc
    if not torch.cuda.is_available():
        raise EngineUnavailableError(
            "gds", "CUDA is not available (torch.cuda.is_available() is False: no GPU or driver)"
        )
    try:
        import kvikio
    except ImportError as exc:
        raise EngineUnavailableError(
            "gds", f"kvikio is not installed (pip install 'tierkit[gds]'): {exc}"
        ) from exc
    return torch, kvikio


class _DeviceSpan:
    """A byte range of device memory, as KvikIO (and CuPy, Numba) take it."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, address: int, size_bytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size_bytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 3,
        }


def _device_ref(obj: Any) -> BufferRef | None:
    """A BufferRef for a CUDA buffer (so IOBatch accepts it), or None for a host buffer."""
    is_torch = is_tensor(obj)
    if is_torch and obj.device.type == "cuda":
        if not obj.is_contiguous():
            raise InvalidArgumentError("tensor buffers must be contiguous (call .contiguous())")
        return BufferRef(int(obj.data_ptr()), obj.numel() * obj.element_size(), True, obj)
    if is_torch:
        return None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    if cai.get("strides") is not None:
        raise InvalidArgumentError("CUDA buffers must be C-contiguous (strides must be None)")
    size = int(np.prod(cai["shape"], dtype=np.int64)) * np.dtype(cai["typestr"]).itemsize
    address, readonly = cai["data"]
    return BufferRef(int(address), size, not readonly, obj)


def _is_device(owner: Any) -> bool:
    # torch CPU tensors raise AttributeError for this property, so hasattr is False for them
    return hasattr(owner, "__cuda_array_interface__")


class GdsEngine(IOEngine):
    """KvikIO/cuFile engine. Raises EngineUnavailableError without CUDA or kvikio."""

    name = "gds"

    def __init__(self, queue_depth: int = 128, env: Env | None = None) -> None:
        self._torch, self._kvikio = _load_backends()
        super().__init__(queue_depth, env)
        self._cufiles: dict[FileHandle, Any] = {}
        self._queue: queue.SimpleQueue[tuple[IOBatch, list[tuple[int, Any, int]]] | None] = (
            queue.SimpleQueue()
        )
        self._waiter: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _own_buffer(self, buffer: Any) -> Any:
        # as_buffer refuses device memory: hand IOBatch a ready BufferRef (the tensor as owner)
        return _device_ref(buffer) or buffer

    # ----------------------------------------------------------------- engine hooks
    def _attach(self, file: FileHandle) -> None:
        try:
            self._cufiles[file] = self._kvikio.CuFile(file.path, "r+" if file.writable else "r")
        except Exception as exc:  # KvikIO raises RuntimeError with the OS message inside
            raise StorageError(errno.EIO, f"kvikio could not open it: {exc}", file.path) from exc

    def _detach(self, file: FileHandle) -> None:
        cufile = self._cufiles.pop(file, None)
        if cufile is not None:
            cufile.close()

    def _start(self, batch: IOBatch) -> None:
        self._loop = asyncio.get_running_loop()
        n = len(batch)
        one_owner = len(batch.owners) != n
        if any(_is_device(o) for o in batch.owners):
            self._torch.cuda.synchronize()
        sizes: dict[FileHandle, int] = {}
        jobs: list[tuple[int, Any, int]] = []
        for row in range(n):
            op, file = int(batch.ops[row]), batch.files[row]
            if op >= FSYNC:
                jobs.append((row, None, 0))
                continue
            offset, size = int(batch.offsets[row]), int(batch.lengths[row])
            if op == READ:  # clip at end of file: KvikIO raises instead of returning short
                if file not in sizes:
                    sizes[file] = self.env.file_size(file.fd)
                size = max(0, min(size, sizes[file] - offset))
            if not size:
                continue
            address = int(batch.addresses[row])
            owner = batch.owners[0 if one_owner else row]
            buf = (
                _DeviceSpan(address, size)
                if _is_device(owner)
                else BufferRef(address, size, True, None).memoryview()
            )
            cufile = self._cufiles[file]
            try:
                call = cufile.pread if op == READ else cufile.pwrite
                jobs.append((row, call(buf, size, offset), size))
            except Exception as exc:
                batch.errors[row] = _typed(exc, file, offset)
        if not jobs:
            self._complete(batch)
            return
        if self._waiter is None:
            self._waiter = threading.Thread(target=self._wait, name="tierkit-gds", daemon=True)
            self._waiter.start()
        self._queue.put((batch, jobs))

    def _wait(self) -> None:
        """Waiter thread: finish each batch's futures in order, then hand it to the loop."""
        while (item := self._queue.get()) is not _STOP:
            batch, jobs = item
            for row, future, size in jobs:
                file = batch.files[row]
                try:
                    if future is None:
                        sync = self.env.fdatasync if batch.ops[row] > FSYNC else self.env.fsync
                        sync(file.fd)
                        continue
                    done = int(future.get())
                    batch.results[row] = done
                    if batch.ops[row] != READ and done != size:
                        batch.errors[row] = error_from_errno(
                            errno.EIO, file.path, int(batch.offsets[row]) + done
                        )
                except BaseException as exc:  # keep the thread alive; report to the caller
                    batch.errors[row] = _typed(exc, file, int(batch.offsets[row]))
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._complete, batch)

    async def _shutdown(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(waiter.join)

    def stats(self) -> dict[str, Any]:
        """Counters, plus KvikIO's compat mode (whether cuFile really bypasses the host)."""
        out = super().stats()
        try:
            out["kvikio_compat_mode"] = str(self._kvikio.defaults.get("compat_mode"))
        except Exception:  # older KvikIO: compat_mode() instead of get()
            out["kvikio_compat_mode"] = str(self._kvikio.defaults.compat_mode())
        return out


def _typed(exc: BaseException, file: FileHandle, offset: int) -> BaseException:
    """OS failures into the error tree; KvikIO's RuntimeErrors become EIO with their message."""
    if isinstance(exc, StorageError) or not isinstance(exc, Exception):
        return exc
    if isinstance(exc, OSError) and exc.errno:
        error = error_from_errno(exc.errno, file.path, offset)
    else:
        error = StorageError(errno.EIO, f"kvikio: {exc}", file.path, offset)
    error.__cause__ = exc
    return error
