"""Staging buffers and the three-stage stream: read subgroup i+1 while stepping i while
subgroup i-1 is written back.

``Staging`` takes ``slots`` buffers of one subgroup object each (master weights + states) and
one gradient buffer from the runtime's aligned buffer cache, keeps them for the optimizer's
life (reused every step: no allocation or page faults per step) and gives them back at close.
Host memory is therefore ``slots * object_bytes + grad_bytes`` whatever the model size. With
CUDA parameters the buffers are page-locked (``cudaHostRegister``) so the gradient copy down
and the weight copy up are DMA; that path is written but untested here (no GPU).

``stream`` runs ``read -> compute -> write`` over the subgroups: subgroup j uses slot
``j % slots``; its read is issued one subgroup ahead, after waiting for the write of the
subgroup that last used the slot (j - slots); the CPU step runs on the calling thread while the
runtime's loop thread moves bytes. With 3 slots the three stages overlap fully; 2 overlap the
read ahead only; 1 runs them in turn.

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

__all__ = ["Staging", "stream"]

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


def stream(
    items: Sequence[T],
    slots: int,
    read: Callable[[T, int], Future[object]],
    compute: Callable[[T, int], None],
    write: Callable[[T, int], Future[object] | None],
) -> None:
    """For each item in order: ``read(item, slot)``, then ``compute(item, slot)`` on this
    thread, then ``write(item, slot)`` (None: nothing to write), pipelined as above."""
    reads: dict[int, Future[object]] = {}
    writes: dict[int, Future[object]] = {}  # slot -> the write still using it

    def issue_read(j: int) -> None:
        slot = j % slots
        pending = writes.pop(slot, None)
        if pending is not None:
            pending.result()
        reads[j] = read(items[j], slot)

    try:
        for j, item in enumerate(items):
            if j not in reads:
                issue_read(j)
            if slots > 1 and j + 1 < len(items):
                issue_read(j + 1)
            reads.pop(j).result()
            compute(item, j % slots)
            written = write(item, j % slots)
            if written is not None:
                writes[j % slots] = written
        for future in list(writes.values()):
            future.result()
    finally:
        leftovers = [*reads.values(), *writes.values()]
        if leftovers:
            concurrent.futures.wait(leftovers)
