"""Tier: one level of the storage hierarchy (HBM, DRAM, CXL, NVMe) as a small async key-value store.

A tier holds whole objects under string keys. A missing key reads as ``None`` (never an
exception). The caller may pass the destination buffer (``into=``, a numpy array, torch tensor
or other writable buffer) and a byte range, so a hit costs one copy into memory the caller
already owns. Every object is charged its size in bytes against ``capacity_bytes``.

``get_many``/``put_many`` move many objects per call; the base class loops over ``get``/``put``
and a tier overrides them where it can batch the I/O (one submission, one durability point).

Concurrency: a tier belongs to one asyncio loop; call it from that loop's thread. Any number of
gets and puts may interleave; a get returns either the old or the new bytes of a key being
overwritten, never a mix, and never bytes of another key.
Invariants: ``used_bytes`` is the sum of the sizes of the objects held;
``used_bytes <= capacity_bytes`` at every await point.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tiers.io.errors import InvalidArgumentError

__all__ = ["ByteRange", "Tier", "check_key", "resolve_range"]

ByteRange = tuple[int, int]  # (offset_bytes, size_bytes) within one object


def check_key(key: str) -> None:
    """Keys are non-empty str of at most 511 UTF-8 bytes (LMDB's key limit)."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"keys are non-empty strings, got {key!r}")
    try:
        encoded = key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"keys must be valid UTF-8: {key!r}") from exc
    if len(encoded) > 511:
        raise InvalidArgumentError("keys are at most 511 bytes of UTF-8")


def resolve_range(size_bytes: int, byte_range: ByteRange | None) -> ByteRange:
    """The (offset, size) a get should return for an object of ``size_bytes``.

    Raises InvalidArgumentError for a range that does not lie inside the object.
    """
    if byte_range is None:
        return 0, size_bytes
    offset, size = byte_range
    if offset < 0 or size < 0 or offset + size > size_bytes:
        raise InvalidArgumentError(
            f"byte range ({offset}, {size}) is outside the {size_bytes}-byte object"
        )
    return offset, size


class Tier(abc.ABC):
    """Interface of HbmTier, DramTier, CxlTier and NvmeTier."""

    kind: str = "abstract"  # "hbm" | "dram" | "cxl" | "nvme"
    supports_persistence = False  # objects survive a restart (NVMe only)
    # A rough cost model for placement and cost-aware eviction; tiers refine it from measurements.
    read_latency_s = 1e-6
    read_bandwidth_bytes_per_s = 10e9

    def __init__(self, name: str, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgumentError(f"tier {name!r}: capacity must be positive")
        self.name = name
        self.capacity_bytes = capacity_bytes

    @property
    @abc.abstractmethod
    def used_bytes(self) -> int:
        """Sum of the sizes of the objects held."""

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @abc.abstractmethod
    async def get(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        """The object's bytes (or the range), or None when the key is absent.

        Args:
            into: destination buffer with room for the result (its first bytes are written);
                when None a new buffer is returned (a uint8 numpy array; a uint8 torch tensor on
                the tier's device for HbmTier).
            byte_range: (offset, size) within the object.
        Returns: ``into`` (filled) or a new buffer of exactly the result's size; None on a miss.
        Raises: InvalidArgumentError (bad range, ``into`` too small), CorruptionError (NVMe).
        """

    @abc.abstractmethod
    async def put(self, key: str, data: Any) -> None:
        """Store a copy of ``data`` (any contiguous buffer or tensor) under ``key``, replacing
        any previous object. Raises CapacityError when it cannot fit, leaving the tier as it was.
        """

    async def get_many(self, keys: Iterable[str], into: list[Any] | None = None) -> list[Any]:
        """Whole objects of ``keys``, aligned with them: each as ``get`` returns it, None where
        absent. ``into``: one destination per key (or None for a new buffer), caller-owned.

        This default gets one key after another; tiers that can batch (NvmeTier: one engine
        submission) override it. Raises as ``get`` (nothing is returned then).
        """
        keys = list(keys)
        if into is not None and len(into) != len(keys):
            raise InvalidArgumentError(f"{len(into)} destinations for {len(keys)} keys")
        outs = into if into is not None else [None] * len(keys)
        return [await self.get(key, into=out) for key, out in zip(keys, outs, strict=True)]

    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """``put`` every (key, data) pair, a later pair of the same key winning; returns when
        all are stored (durable, on a persistent tier: NvmeTier shares one durability point).

        This default puts one after another and stops at the first failure (the pairs before
        it stay stored); tiers that can batch override it.
        """
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, data in dict(pairs).items():
            await self.put(key, data)

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove ``key``; True when it was present."""

    async def delete_many(self, keys: Iterable[str]) -> int:
        """Remove every key of ``keys``; how many were present. This default deletes one
        after another; NvmeTier commits them all in one catalog transaction."""
        return sum([await self.delete(key) for key in dict.fromkeys(keys)])

    @abc.abstractmethod
    def size_of(self, key: str) -> int | None:
        """The object's size in bytes, or None when absent (no I/O)."""

    @abc.abstractmethod
    def keys(self, prefix: str = "") -> Iterator[str]:
        """A snapshot of the keys starting with ``prefix`` (no particular order)."""

    async def contains(self, key: str) -> bool:
        return self.size_of(key) is not None

    def estimated_read_s(self, size_bytes: int) -> float:
        """Seconds to read ``size_bytes`` back from this tier (for cost-aware policies)."""
        return self.read_latency_s + size_bytes / self.read_bandwidth_bytes_per_s

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "capacity_bytes": self.capacity_bytes,
            "used_bytes": self.used_bytes,
            "objects": sum(1 for _ in self.keys()),
        }

    async def aclose(self) -> None:  # noqa: B027  (optional hook)
        """Release the tier's memory or files; later calls fail with EngineClosedError."""
