"""Shared-memory slabs: batch buffers in /dev/shm that the loader's worker processes map by name.

:class:`ShmSlabPool` is a :class:`~dataload.slabs.SlabPool` whose slabs are files in /dev/shm,
so a source's reads land in memory the workers can map (:class:`Attachments`) and batches come
back through it: no sample byte is pickled. A slab is reused, as in SlabPool, once its array's
reference count says nothing outside the pool refers to it (every tensor the loader hands out
is a view of its slab and keeps it alive).

Names are ``tkdl-<pid>-<pool>-<n>``. A name is unlinked when the pool retires the slab (it is
free and the pool is over ``max_slabs``) and, for every slab, at ``close`` -- also at
interpreter exit through ``weakref.finalize`` -- so nothing is left in /dev/shm however the
loader ends, short of the process being killed; the next pool created on the machine removes
the files of dead processes (:func:`remove_orphans`). Unlinking a slab still in use is safe:
the mapping lives until the last view goes.

Python's ``multiprocessing.shared_memory`` is not used: in 3.11 every attach registers the
segment with a resource-tracker process, which would unlink it when any worker exits.

Concurrency: a pool is used by one thread (the I/O loop); ``close`` may come from any thread
once that thread is done with the pool. ``Attachments`` belongs to one worker process.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import sys
import weakref
from collections import OrderedDict

import numpy as np

from dataload.slabs import SlabPool

__all__ = ["SHM_DIR", "Attachments", "ShmSlabPool", "remove_orphans", "shm_names"]

SHM_DIR = "/dev/shm"
PREFIX = "tkdl-"
_GRANULE_BYTES = 1 << 20  # shm slabs are rounded up to 1 MiB so batches of any size share them
_pool_ids = itertools.count()


def shm_names(pid: int | None = None) -> list[str]:
    """The loader's slab names now in /dev/shm (of process ``pid``, default: all)."""
    head = PREFIX if pid is None else f"{PREFIX}{pid}-"
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(head))
    except FileNotFoundError:
        return []


def remove_orphans() -> int:
    """Unlink slabs left by loader processes that no longer exist; how many were removed."""
    removed = 0
    for name in shm_names():
        pid = int(name[len(PREFIX) :].split("-", 1)[0] or 0)
        if pid and not _alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _map(name: str, size_bytes: int, create: bool) -> np.ndarray:
    path = os.path.join(SHM_DIR, name)
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size_bytes)
        region = mmap.mmap(fd, size_bytes)
    finally:
        os.close(fd)
    return np.frombuffer(region, np.uint8)  # the mapping lives while any view of it does


class ShmSlabPool(SlabPool):
    """Slabs in /dev/shm; ``locate`` names the slab and offset of any array it handed out."""

    def __init__(self, max_slabs: int = 16) -> None:
        super().__init__(max_slabs, alignment_bytes=64)
        self._prefix = f"{PREFIX}{os.getpid()}-{next(_pool_ids)}-"
        self._counter = itertools.count()
        self._shm: list[tuple[np.ndarray, str, int]] = []  # (array, name, address)
        self._names: set[str] = set()
        probe = [np.frombuffer(mmap.mmap(-1, mmap.PAGESIZE), np.uint8)]
        self._free_refs = sys.getrefcount(probe[0])
        self._finalizer = weakref.finalize(self, _unlink_all, self._names)

    def acquire(self, size_bytes: int) -> np.ndarray:
        """A writable uint8 array of exactly ``size_bytes`` at the start of a free slab."""
        for array, _, _ in self._shm:
            if array.nbytes >= size_bytes and sys.getrefcount(array) <= self._free_refs + 1:
                return array[:size_bytes]
        rounded = -(-max(size_bytes, 1) // _GRANULE_BYTES) * _GRANULE_BYTES
        name = f"{self._prefix}{next(self._counter)}"
        array = _map(name, rounded, create=True)
        self._names.add(name)
        self.allocated += 1
        self._shm.append((array, name, array.__array_interface__["data"][0]))
        if len(self._shm) > self.max_slabs:
            self._retire_one()
        return array[:size_bytes]

    def _retire_one(self) -> None:
        """Unlink the smallest free slab (its memory goes when its last view does)."""
        free = [i for i in range(len(self._shm)) if self._is_free(i)]
        if free:
            victim = min(free, key=lambda i: self._shm[i][0].nbytes)
            _, name, _ = self._shm.pop(victim)
            _unlink(name)
            self._names.discard(name)

    def locate(self, view: np.ndarray) -> tuple[str, int]:
        """(slab name, byte offset) of ``view``, an array from :meth:`acquire`."""
        address = view.__array_interface__["data"][0]
        for array, name, start in self._shm:
            if start <= address < start + array.nbytes or (address == start and not view.nbytes):
                return name, address - start
        raise ValueError("the array is not in a slab of this pool")

    def in_use(self) -> int:
        return sum(1 for i in range(len(self._shm)) if not self._is_free(i))

    def _is_free(self, i: int) -> bool:
        return sys.getrefcount(self._shm[i][0]) <= self._free_refs  # the tuple's + the call's

    def clear(self) -> None:
        """Unlink every slab; arrays still viewed stay valid until their views go."""
        self._shm.clear()
        self._finalizer()

    @property
    def names(self) -> list[str]:
        return sorted(self._names)


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def _unlink_all(names: set[str]) -> None:
    for name in list(names):
        _unlink(name)
    names.clear()


class Attachments:
    """A worker's mappings of the loader's slabs, least recently used dropped beyond ``limit``."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, name: str, min_size_bytes: int) -> np.ndarray:
        array = self._maps.get(name)
        if array is not None and array.nbytes >= min_size_bytes:
            self._maps.move_to_end(name)
            return array
        size = os.stat(os.path.join(SHM_DIR, name)).st_size
        array = self._maps[name] = _map(name, size, create=False)
        while len(self._maps) > self.limit:
            self._maps.popitem(last=False)
        return array

    def clear(self) -> None:
        self._maps.clear()
