"""ArenaTier: a Tier whose objects are extents of one preallocated, contiguous byte arena.

HbmTier, DramTier and CxlTier differ only in where the arena lives and how bytes are copied in
and out; this base keeps the key -> (offset, size) index, the ExtentAllocator, the capacity
accounting and the counters. Nothing is allocated per object: a put takes an extent of the arena.

A put allocates the new extent, copies, and only then frees the old copy of the key, so a
CapacityError (or a copy that fails) leaves the tier as it was and a reader sees the old or the new
bytes, never a mix. Two refinements keep the arena usable up to ``capacity_bytes``: when the free
space is enough in total but split into holes too small, the put first compacts (objects slide
toward offset 0, one copy each, in address order, until a hole fits), so fragmentation never
refuses a put; and an overwrite that fits only once its old copy is gone drops that copy first
(the copy is synchronous, so no reader can see the gap); both live in tiers.memory.arena_space.
Zero-size objects take no extent. ``get_now``/``put_now``/``delete_now`` are the synchronous
bodies of get/put/delete, for callers that save the coroutine (TieredStore's hits, promotions).

Concurrency: one asyncio loop thread (see Tier). Every copy, compaction included, is synchronous
and never spans an await, so no coroutine can observe a half-moved or half-written object.
An arena the OS or device cannot provide is a NoMemoryError naming the tier (``_no_memory``),
never a bare OSError or RuntimeError.

Invariants: ``used_bytes`` == sum of object sizes <= ``capacity_bytes``; the extents of the
objects are disjoint and lie inside ``[0, arena_bytes)``; after ``aclose`` every call but
``stats`` raises EngineClosedError.
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tiers.io.errors import CapacityError, EngineClosedError, InvalidArgumentError, NoMemoryError
from tiers.memory.arena_space import ArenaSpace
from tiers.storage.extents import ExtentAllocator
from tiers.storage.tier import ByteRange, Tier, check_key, resolve_range

__all__ = ["ArenaTier"]


class ArenaTier(ArenaSpace, Tier):
    """Base of the memory tiers. Subclasses create the arena and implement the copy hooks."""

    def __init__(self, name: str, capacity_bytes: int, *, alignment_bytes: int) -> None:
        super().__init__(name, capacity_bytes)
        mask = alignment_bytes - 1
        self.arena_bytes = (capacity_bytes + mask) & ~mask
        self._extents = ExtentAllocator(self.arena_bytes, alignment_bytes)
        self._index: dict[str, tuple[int, int]] = {}  # key -> (arena offset, size in bytes)
        self._used_bytes = 0
        self._closed = False
        self.hits = self.misses = self.bytes_read = self.bytes_written = 0
        self.compactions = self.compacted_bytes = 0

    # -- hooks: where the arena lives and how bytes move ------------------------------------------

    @abc.abstractmethod
    def _source(self, data: Any) -> tuple[Any, int]:
        """(a view of ``data`` that ``_write`` can copy from, its size in bytes), no copy made.

        Raises InvalidArgumentError for data that is not a contiguous buffer or tensor.
        """

    @abc.abstractmethod
    def _write(self, offset_bytes: int, source: Any, size_bytes: int) -> None:
        """Copy a ``_source`` view of ``size_bytes`` into the arena at ``offset_bytes``."""

    @abc.abstractmethod
    def _read_new(self, offset_bytes: int, size_bytes: int) -> Any:
        """A new buffer holding a copy of the arena's bytes (never a view of the arena)."""

    @abc.abstractmethod
    def _read_into(self, offset_bytes: int, size_bytes: int, into: Any) -> Any:
        """Copy the bytes into the first ``size_bytes`` of ``into``; return ``into``.

        Raises InvalidArgumentError when ``into`` is too small, read-only or not a buffer.
        """

    @abc.abstractmethod
    def _move(self, dst_offset_bytes: int, src_offset_bytes: int, size_bytes: int) -> None:
        """Copy bytes within the arena toward lower offsets; the ranges may overlap."""

    @abc.abstractmethod
    def _release_arena(self) -> None:
        """Free the arena's memory."""

    # -- Tier -------------------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    @property
    def free_bytes(self) -> int:
        """The largest size a put can take now: the capacity left, but no more than the arena's
        free extents hold, because each object's extent is rounded up to the alignment (so a
        tier of small objects fills its arena before its byte count says so)."""
        unit = self._extents.alignment_bytes
        arena_free = self._extents.free_bytes // unit * unit
        return min(self.capacity_bytes - self._used_bytes, arena_free)

    async def get(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        return self.get_now(key, into=into, byte_range=byte_range)

    def get_now(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        entry = self._index.get(key)
        if entry is None:
            self._miss(key)
            return None
        offset, size = entry
        if byte_range is not None:
            start, size = resolve_range(size, byte_range)
            offset += start
        out = self._read_new(offset, size) if into is None else self._read_into(offset, size, into)
        self.hits += 1
        self.bytes_read += size
        return out

    async def get_many(self, keys: Iterable[str], into: list[Any] | None = None) -> list[Any]:
        """Every copy in one synchronous pass (no await between keys, so all come from one
        state of the arena)."""
        keys = list(keys)
        if into is not None and len(into) != len(keys):
            raise InvalidArgumentError(f"{len(into)} destinations for {len(keys)} keys")
        index = self._index
        out: list[Any] = []
        for slot, key in enumerate(keys):
            entry = index.get(key)
            if entry is None:
                self._miss(key)
                out.append(None)
                continue
            offset, size = entry
            dst = None if into is None else into[slot]
            out.append(
                self._read_new(offset, size) if dst is None else self._read_into(offset, size, dst)
            )
            self.hits += 1
            self.bytes_read += size
        return out

    async def put(self, key: str, data: Any) -> None:
        self.put_now(key, data)

    def put_now(self, key: str, data: Any) -> None:
        check_key(key)
        self._check_open()
        source, size = self._source(data)
        self._check_fits({key: size})
        self._store_copy(key, source, size)

    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """All pairs or none: every key and value is checked, and the capacity for all of them,
        before the first copy; then the copies run in one synchronous pass."""
        self._check_open()
        pairs = dict(items.items() if isinstance(items, Mapping) else items)
        sources = {}
        for key, data in pairs.items():
            check_key(key)
            sources[key] = self._source(data)
        self._check_fits({key: size for key, (_, size) in sources.items()})
        for key, (source, size) in sources.items():
            self._store_copy(key, source, size)

    def _check_fits(self, sizes: dict[str, int]) -> None:
        index = self._index
        freed = sum(index[key][1] for key in sizes if key in index)
        used_after = self._used_bytes - freed + sum(sizes.values())
        if used_after > self.capacity_bytes:
            what = next(iter(sizes)) if len(sizes) == 1 else f"{len(sizes)} objects"
            raise CapacityError(
                f"tier {self.name!r}: {sum(sizes.values())} bytes for {what!r} would make "
                f"{used_after} of {self.capacity_bytes} bytes used"
            )

    def _store_copy(self, key: str, source: Any, size: int) -> None:
        offset = self._allocate(key, size)
        try:
            self._write(offset, source, size)
        except BaseException:
            self._free(offset, size)
            raise
        self._drop(key)  # the old copy, wherever compaction left it
        self._index[key] = (offset, size)
        self._used_bytes += size
        self.bytes_written += size

    async def delete(self, key: str) -> bool:
        return self.delete_now(key)

    def delete_now(self, key: str) -> bool:
        self._check_open()
        return self._drop(key)

    def size_of(self, key: str) -> int | None:
        entry = self._index.get(key)
        if entry is None:
            self._check_open()
            return None
        return entry[1]

    def keys(self, prefix: str = "") -> Iterator[str]:
        self._check_open()
        return iter([k for k in self._index if k.startswith(prefix)])

    def extent_of(self, key: str) -> tuple[int, int] | None:
        """(arena offset, size in bytes) of the object, or None; valid until the next put."""
        self._check_open()
        return self._index.get(key)

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "capacity_bytes": self.capacity_bytes,
            "used_bytes": self._used_bytes,
            "objects": len(self._index),
            "arena_bytes": self.arena_bytes,
            "arena_free_bytes": self._extents.free_bytes,
            "hits": self.hits,
            "misses": self.misses,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "compactions": self.compactions,
            "compacted_bytes": self.compacted_bytes,
            "closed": self._closed,
        }

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._index = {}
        self._used_bytes = 0
        self._release_arena()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError(f"tier {self.name!r} is closed")

    def _miss(self, key: str) -> None:
        self._check_open()
        check_key(key)
        self.misses += 1
        return None

    def _no_memory(self, reason: str, where: str = "memory") -> NoMemoryError:
        """The error for an arena that cannot be had, naming this tier and ``reason``."""
        return NoMemoryError(
            errno.ENOMEM,
            f"{self.kind} tier {self.name!r}: cannot allocate its {self.arena_bytes}-byte arena "
            f"in {where}: {reason}",
        )

    def _check_into_size(self, available_bytes: int, size_bytes: int) -> None:
        if available_bytes < size_bytes:
            raise InvalidArgumentError(
                f"the destination holds {available_bytes} bytes; the result is {size_bytes}"
            )
