"""SyncKVBlockStore: KVBlockStore for callers that are not async (vLLM's connector hooks).

The store lives on the runtime's loop thread; each method submits its coroutine there and
waits for the result, so any thread may call it, and many threads' calls interleave on the
loop as tasks would (loads of different threads share NVMe submissions).

Thread-safety: every method may be called from any thread but the runtime's loop thread.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import torch

from kvstore.block_store import KVBlockStore
from kvstore.fingerprint import ModelFingerprint
from tiers import IORuntime, default_runtime

__all__ = ["SyncKVBlockStore"]

T = TypeVar("T")


class SyncKVBlockStore:
    """Blocking facade over a KVBlockStore on ``runtime``'s loop thread."""

    def __init__(self, store: KVBlockStore, runtime: IORuntime, timeout_s: float) -> None:
        self.store = store
        self.fingerprint = store.fingerprint
        self._runtime = runtime
        self._timeout_s = timeout_s
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str] | None,
        fingerprint: ModelFingerprint,
        *,
        runtime: IORuntime | None = None,
        timeout_s: float = 600.0,
        **options: Any,
    ) -> SyncKVBlockStore:
        """``KVBlockStore.open(directory, fingerprint, **options)`` on the runtime's loop."""
        runtime = runtime or default_runtime()
        opening = KVBlockStore.open(directory, fingerprint, runtime=runtime, **options)
        store = runtime.submit(opening).result(timeout_s)
        return cls(store, runtime, timeout_s)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._runtime.submit(coroutine).result(self._timeout_s)

    def lookup(self, hashes: Iterable[bytes], *, touch: bool = True) -> int:
        return self._run(self.store.lookup(list(hashes), touch=touch))

    def store_blocks(
        self, hashes: Iterable[bytes], blocks: torch.Tensor, *, parent: bytes | None = None
    ) -> int:
        return self._run(self.store.store(list(hashes), blocks, parent=parent))

    def load(self, hashes: Iterable[bytes], into: torch.Tensor, *, touch: bool = False) -> int:
        return self._run(self.store.load(list(hashes), into, touch=touch))

    def load_layer(self, hashes: Iterable[bytes], layer: int, into: torch.Tensor) -> int:
        return self._run(self.store.load_layer(list(hashes), layer, into))

    def pin(self, hashes: Iterable[bytes]) -> int:
        return self._run(self.store.pin(list(hashes)))

    def unpin(self, hashes: Iterable[bytes]) -> int:
        return self._run(self.store.unpin(list(hashes)))

    def evict(self, hashes: Iterable[bytes]) -> int:
        return self._run(self.store.evict(list(hashes)))

    def stats(self) -> dict[str, Any]:
        return self._run(_stats(self.store))

    def __len__(self) -> int:
        return len(self.store)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._run(self.store.aclose())

    def __enter__(self) -> SyncKVBlockStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _stats(store: KVBlockStore) -> dict[str, Any]:
    return store.stats()
