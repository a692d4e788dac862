"""Staging buffers and the three-stage stream: read subgroup i+1 while stepping i while
subgroup i-1 is written back.

``Staging`` takes ``slots`` buffers of one subgroup object each (master weights + states) and
one gradient buffer from the runtime's aligned buffer cache, keeps them for the optimizer's
life (reused every step: no allocation or page faults per step) and gives them back at close.
Host memory is therefore ``slots * object_bytes + grad_bytes`` whatever the model size. With
CUDA parameters the buffers are page-locked (``cudaHostRegister``) so the gradient copy down
and the weight copy up are DMA; that path is written but untested here (no GPU).

``stream`` runs ``read -> compute -> write`` over the subgroups: subgroup j uses slot
``j % slots``; its read is issued ``ahead`` subgroups ahead, after waiting for the write of the
subgroup that last used the slot (j - slots); the CPU step runs on the calling thread while the
runtime's loop thread moves bytes; computed subgroups are written ``batch`` at a time (one
``put_many``: one submission, one durability point for the batch). With 3 slots (ahead 1,
batch 1) the three stages overlap fully; 2 overlap the read ahead only; 1 runs them in turn;
4 (the default, sizing.MAX_SLOTS) read two ahead; more write in batches too (``depth``),
which keeps more requests in flight on the device.

Thread-safety: a Staging belongs to one optimizer, used by one thread at a time.
Invariants: a slot is never read into or computed on while I/O on it is in flight; ``stream``
waits for every future it started before returning or raising (buffers are never given back
with I/O landing in them).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from tiers import IORuntime

__all__ = ["Staging", "depth", "stream"]

T = TypeVar("T")
Future = concurrent.futures.Future


class Staging:
    def __init__(
        self, runtime: IORuntime, object_bytes: int, slots: int, grad_bytes: int, pin: bool
    ) -> None:
        self.runtime = runtime
        self.object_bytes = object_bytes
        self.slots: list[np.ndarray] = [runtime.buffers.take(object_bytes) for _ in range(slots)]
        self.grad: np.ndarray = runtime.buffers.take(grad_bytes)
        self._pinned: list[np.ndarray] = []
        if pin:  # untested: needs a CUDA device
            cudart = torch.cuda.cudart()
            for buffer in [*self.slots, self.grad]:
                cudart.cudaHostRegister(buffer.ctypes.data, buffer.nbytes, 0)
                self._pinned.append(buffer)

    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.slots) + self.grad.nbytes

    def slot_bytes(self, slot: int, size_bytes: int) -> np.ndarray:
        return self.slots[slot][:size_bytes]

    def slot_fp32(self, slot: int, numel: int) -> torch.Tensor:
        return torch.from_numpy(self.slots[slot][: numel * 4]).view(torch.float32)

    def grad_fp32(self, numel: int) -> torch.Tensor:
        return torch.from_numpy(self.grad[: numel * 4]).view(torch.float32)

    def close(self) -> None:
        if self._pinned:
            cudart = torch.cuda.cudart()
            for buffer in self._pinned:
                cudart.cudaHostUnregister(buffer.ctypes.data)
            self._pinned = []
        for buffer in [*self.slots, self.grad]:
            self.runtime.buffers.give(buffer)
        self.slots = []


def depth(slots: int) -> tuple[int, int]:
    """(read-ahead, write batch) that ``slots`` staging slots allow with full overlap: a
    batch being filled and one being written, and the reads ahead in the rest."""
    batch = max(1, (slots - 1) // 2)
    return max(1 if slots > 1 else 0, slots - 2 * batch), batch


def stream(
    items: Sequence[T],
    slots: int,
    read: Callable[[T, int], Future[object]],
    compute: Callable[[T, int], None],
    write: Callable[[list[tuple[T, int]]], Future[object] | None],
    *,
    ahead: int | None = None,
    batch: int | None = None,
) -> None:
    """For each item in order: ``read(item, slot)``, then ``compute(item, slot)`` on this
    thread; every ``batch`` computed items go to one ``write([(item, slot), ...])`` (None:
    nothing to write). Item j uses slot ``j % slots``; reads run ``ahead`` items ahead of
    the compute (default and batch: ``depth(slots)``); a read into a slot first waits for
    the write of the item that used it last (a batch not yet written is written first)."""
    default_ahead, default_batch = depth(slots)
    ahead = default_ahead if ahead is None else ahead
    batch = max(1, default_batch if batch is None else batch)
    reads: dict[int, Future[object]] = {}
    writes: dict[int, Future[object]] = {}  # slot -> the write still using it
    pending: list[tuple[T, int]] = []  # computed, not yet given to write
    issued = 0

    def flush() -> None:
        if pending:
            future = write(list(pending))
            if future is not None:
                writes.update((slot, future) for _, slot in pending)
            pending.clear()

    def issue_reads(upto: int) -> None:
        nonlocal issued
        while issued < min(upto, len(items)):
            slot = issued % slots
            if any(held == slot for _, held in pending):
                flush()
            pending_write = writes.pop(slot, None)
            if pending_write is not None:
                pending_write.result()
            reads[issued] = read(items[issued], slot)
            issued += 1

    try:
        for j, item in enumerate(items):
            issue_reads(j + 1 + ahead)
            reads.pop(j).result()
            compute(item, j % slots)
            pending.append((item, j % slots))
            if len(pending) >= batch:
                flush()
        flush()
        for future in list(writes.values()):
            future.result()
    finally:
        leftovers = [*reads.values(), *writes.values()]
        if leftovers:
            concurrent.futures.wait(leftovers)
