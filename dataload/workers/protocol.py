"""What the loader and its worker processes say to each other, and how batches cross in memory.

Messages are plain pickles sent with ``Connection.send_bytes`` (not multiprocessing's
ForkingPickler, which torch extends to move tensors through its own shared-memory files):

* loader -> worker: a :class:`Task` (one batch) or :data:`STOP`;
* worker -> loader: :data:`READY` once after ``worker_init_fn``, then a :class:`Done` or a
  :class:`Failed` per task (``task_id`` -1: the worker could not start).

Sample bytes never go through the pipe: a task names the shared-memory slab the I/O core read
into (``data_ref``) and a slab for the result (``out_ref``). The worker collates, then
:func:`pack_tree` copies every tensor and numeric array of the result into the output slab and
leaves a :class:`TensorRef` in its place; :func:`unpack_tree` turns those back into tensors that
are views of the slab in the loader's process. A result that does not fit is pickled instead
(``Done.spec`` is then the value itself) and the loader sizes the next output slabs up.

Exceptions are sent as fields, never pickled objects (SampleError's constructor takes more than
one argument, and a user's exception class may not unpickle in the loader).

Concurrency: pure functions and immutable records; safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dataload.errors import SampleError, TransformError
from tiers.io import TierkitError

__all__ = [
    "READY",
    "STOP",
    "Done",
    "Failed",
    "NoRoom",
    "Task",
    "TensorRef",
    "WorkerDiedError",
    "WorkerError",
    "pack_tree",
    "unpack_tree",
]

STOP = b"stop"
READY = b"ready"
_ALIGN_BYTES = 64  # every tensor starts 64-byte aligned, so any dtype can view its bytes


class WorkerError(TierkitError, RuntimeError):
    """A worker process failed outside any one sample (``worker_init_fn``, an unpicklable
    result); the worker's traceback is part of the message."""


class WorkerDiedError(TierkitError, RuntimeError):
    """A worker process exited while it held batches (killed, crashed, ``os._exit``).

    ``worker_id``, ``pid``, ``exitcode`` (negative: the signal number) and ``sample_indices``
    (the samples of the batches it held) say what was lost. The loader's ``state_dict`` still
    names the next batch, so a new loader resumes exactly there.
    """

    def __init__(
        self, worker_id: int, pid: int | None, exitcode: int | None, sample_indices: list[int]
    ) -> None:
        how = _exit_words(exitcode)
        shown = sample_indices[:8]
        more = f" and {len(sample_indices) - 8} more" if len(sample_indices) > 8 else ""
        super().__init__(
            f"loader worker {worker_id} (pid {pid}) {how} while it held samples {shown}{more}"
        )
        self.worker_id, self.pid, self.exitcode = worker_id, pid, exitcode
        self.sample_indices = sample_indices


def _exit_words(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        import signal

        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


@dataclass
class Task:
    """One batch for a worker. Byte batches: ``data_ref`` = (slab name, offset, length) of the
    bytes, with ``starts``/``sizes`` relative to that offset. Table batches: ``columns``.
    Dataset batches without located bytes: only ``indices``."""

    task_id: int
    indices: np.ndarray
    data_ref: tuple[str, int, int] | None = None
    starts: np.ndarray | None = None
    sizes: np.ndarray | None = None
    packed: bool = False
    labels: np.ndarray | None = None
    columns: dict[str, Any] | None = None
    failed_positions: list[int] = field(default_factory=list)
    bytes_read: int = 0
    out_ref: tuple[str, int] | None = None  # (slab name, capacity in bytes)


@dataclass
class Done:
    task_id: int
    spec: Any  # the result with TensorRefs (packed) or the result itself (pickled)
    packed: bool
    samples: int
    skipped: int
    bytes_read: int
    out_bytes: int  # what the result needs in a slab (to size the next ones)


@dataclass
class Failed:
    task_id: int
    error_type: str  # class name; "TransformError" etc. are rebuilt as themselves
    source: str | None
    sample_index: int | None
    message: str
    traceback: str

    def exception(self, worker_id: int, pid: int | None) -> BaseException:
        where = f"in loader worker {worker_id} (pid {pid})"
        detail = f"{self.message}\n\n{where}, traceback:\n{self.traceback}"
        if self.sample_index is not None and self.source is not None:
            if self.error_type == "TransformError":
                return TransformError(self.source, self.sample_index, detail)
            return SampleError(self.source, self.sample_index, f"{self.error_type}: {detail}")
        return WorkerError(f"{self.error_type} {where}: {self.message}\n{self.traceback}")


@dataclass(frozen=True)
class TensorRef:
    """A tensor stored in the output slab: ``offset`` bytes in, with this dtype and shape."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    numpy: bool = False  # was a numpy array; comes back as one


class NoRoom(Exception):
    """The result needs ``needed_bytes``, more than the output slab has."""

    def __init__(self, needed_bytes: int) -> None:
        super().__init__(needed_bytes)
        self.needed_bytes = needed_bytes


def tree_bytes(value: Any) -> int:
    """Bytes the tensors and numeric arrays of ``value`` need in a slab (aligned)."""
    if isinstance(value, torch.Tensor):
        return _aligned(value.numel() * value.element_size())
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return _aligned(value.nbytes)
    if isinstance(value, (list, tuple)):
        return sum(tree_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tree_bytes(v) for v in value.values())
    return 0


def pack_tree(value: Any, out: np.ndarray) -> Any:
    """``value`` with its tensors copied into ``out`` (uint8) and replaced by TensorRefs.

    Raises:
        NoRoom: ``out`` is too small (nothing useful has been written).
    """
    needed = tree_bytes(value)
    if needed > len(out):
        raise NoRoom(needed)
    cursor = [0]

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return _store(node, out, cursor, numpy=False)
        if isinstance(node, np.ndarray) and node.dtype.kind in "biuf":
            return _store(torch.from_numpy(np.ascontiguousarray(node)), out, cursor, numpy=True)
        if isinstance(node, tuple):
            items = [walk(v) for v in node]
            return type(node)(*items) if hasattr(node, "_fields") else tuple(items)
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    return walk(value)


def _store(tensor: torch.Tensor, out: np.ndarray, cursor: list[int], numpy: bool) -> TensorRef:
    offset, size = cursor[0], tensor.numel() * tensor.element_size()
    tensor = tensor.detach()
    if size:
        target = torch.from_numpy(out[offset : offset + size]).view(tensor.dtype)
        target.view(tensor.shape).copy_(tensor)
    cursor[0] = offset + _aligned(size)
    return TensorRef(offset, tensor.dtype, tuple(tensor.shape), numpy)


def unpack_tree(spec: Any, out: np.ndarray) -> Any:
    """The value :func:`pack_tree` packed, its tensors views of ``out``."""
    if isinstance(spec, TensorRef):
        size = int(np.prod(spec.shape, dtype=np.int64)) * _itemsize(spec.dtype)
        raw = torch.from_numpy(out[spec.offset : spec.offset + size])
        if size:
            tensor = raw.view(spec.dtype).view(spec.shape)
        else:
            tensor = torch.empty(spec.shape, dtype=spec.dtype)
        return tensor.numpy() if spec.numpy else tensor
    if isinstance(spec, tuple):
        items = [unpack_tree(v, out) for v in spec]
        return type(spec)(*items) if hasattr(spec, "_fields") else tuple(items)
    if isinstance(spec, list):
        return [unpack_tree(v, out) for v in spec]
    if isinstance(spec, dict):
        return {k: unpack_tree(v, out) for k, v in spec.items()}
    return spec


def _itemsize(dtype: torch.dtype) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


_ITEMSIZE: dict[torch.dtype, int] = {}


def _aligned(size_bytes: int) -> int:
    return -(-size_bytes // _ALIGN_BYTES) * _ALIGN_BYTES
