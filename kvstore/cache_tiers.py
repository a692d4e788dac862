"""open_cache_store: the tiered store under a KV cache (blocks or chunks), DRAM over NVMe.

Both of kvstore's caches sit on the same shape of store: an optional DRAM tier of the hot
objects over an optional NVMe tier that holds every object (write-through, so an acknowledged
write survives ``kill -9``); with no disk tier nothing survives a restart. ``create=False``
makes a directory that holds no store an error, so a mistyped path is not a new, empty cache.

Thread-safety: call from the event loop the store will belong to.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

from tiers import InvalidArgumentError, TieredStore, open_store
from tiers.io import IORuntime

__all__ = ["open_cache_store"]


async def open_cache_store(
    directory: str | os.PathLike[str] | None,
    *,
    dram_bytes: int,
    disk_bytes: int,
    create: bool,
    runtime: IORuntime | None,
) -> TieredStore:
    """A store with a DRAM tier of ``dram_bytes`` (0: none) over an NVMe tier of
    ``disk_bytes`` (0: none) in ``directory``."""
    tiers: list[dict[str, Any]] = []
    if dram_bytes:
        tiers.append({"kind": "dram", "capacity": dram_bytes})
    if disk_bytes:
        if directory is None:
            raise InvalidArgumentError("a disk tier needs a directory")
        if create:
            os.makedirs(directory, exist_ok=True)
        tiers.append(
            {"kind": "nvme", "capacity": disk_bytes, "path": os.fspath(directory),
             "create": create}
        )  # fmt: skip
    if not tiers:
        raise InvalidArgumentError("give dram_bytes, disk_bytes or both")
    with gc_paused():
        return await open_store({"policy": "lru", "tiers": tiers}, runtime)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector: building millions of long-lived objects (a reopen's index)
    otherwise runs it over them again and again (a third of a reopen's time at 100k blocks)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
