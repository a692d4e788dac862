"""Catalog: the named collections under one data directory.

Layout: ``<data>/collections/<name>/`` per collection (collection.py). Creating builds the
collection under a hidden name and renames it into place, and deleting renames it away before
removing it, so a crash never leaves half a collection under a real name; opening removes what
such a crash left (``.creating-*``, ``.deleting-*``).

Thread-safety: one asyncio loop; create and delete are serialised by a lock, and a name being
created or deleted is refused meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import uuid

from tiers.io import IORuntime, default_env
from tiers.storage import fsync_directory
from vectordb.collections.collection import Collection
from vectordb.collections.errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    InvalidCollectionError,
)
from vectordb.collections.points import CollectionConfig

__all__ = ["Catalog"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")


class Catalog:
    def __init__(
        self, root: str, runtime: IORuntime | None, memory_budget_bytes: int | None
    ) -> None:
        self.root = root
        self._runtime = runtime
        self._budget = memory_budget_bytes
        self._collections: dict[str, Collection] = {}
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        runtime: IORuntime | None = None,
        memory_budget_bytes: int | None = None,
    ) -> Catalog:
        """Open every collection under ``data_dir`` (created if missing). Call inside the
        loop that will use it: the I/O engine binds to it."""
        root = os.path.join(os.fspath(data_dir), "collections")
        os.makedirs(root, exist_ok=True)
        catalog = cls(root, runtime, memory_budget_bytes)
        try:
            for entry in sorted(os.listdir(root)):
                path = os.path.join(root, entry)
                if entry.startswith("."):
                    shutil.rmtree(path, ignore_errors=True)  # a crash's leftovers
                elif _NAME.fullmatch(entry):
                    catalog._collections[entry] = await Collection.open(
                        entry, path, runtime, memory_budget_bytes
                    )
        except BaseException:
            await catalog.aclose()
            raise
        return catalog

    def names(self) -> list[str]:
        return sorted(self._collections)

    def get(self, name: str) -> Collection:
        try:
            return self._collections[name]
        except KeyError:
            raise CollectionNotFoundError(f"collection {name[:300]!r} not found") from None

    async def create(self, name: str, config: CollectionConfig) -> Collection:
        _check_name(name)
        async with self._lock:
            if name in self._collections:
                raise CollectionExistsError(f"collection {name!r} already exists")
            staging = os.path.join(self.root, f".creating-{uuid.uuid4().hex}")
            try:
                collection = await Collection.create(
                    name, staging, config, self._runtime, self._budget
                )
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            await collection.aclose()  # its files move: reopen from the final place
            final = os.path.join(self.root, name)
            os.rename(staging, final)
            fsync_directory(default_env, self.root)
            collection = await Collection.open(name, final, self._runtime, self._budget)
            self._collections[name] = collection
            return collection

    async def delete(self, name: str) -> bool:
        async with self._lock:
            collection = self._collections.pop(name, None)
            if collection is None:
                return False
            await collection.aclose()
            doomed = os.path.join(self.root, f".deleting-{uuid.uuid4().hex}")
            os.rename(os.path.join(self.root, name), doomed)
            fsync_directory(default_env, self.root)
            await asyncio.to_thread(shutil.rmtree, doomed, True)
            return True

    async def aclose(self) -> None:
        """Close every collection (each checkpoints its index)."""
        async with self._lock:
            collections, self._collections = list(self._collections.values()), {}
            errors = []
            for collection in collections:
                try:
                    await collection.aclose()
                except Exception as exc:  # close the others; raise the first afterwards
                    errors.append(exc)
            if errors:
                raise errors[0]


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidCollectionError("a collection name is 1 to 255 letters, digits, '_' or '-'")
