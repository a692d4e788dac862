"""LMDB environments as tierkit opens and writes them: checked, in the error tree, growing.

Every LMDB store here (the NVMe tier's catalog, the vector index's checkpoint store, the data
loader's LMDB sources) opens its environment with :func:`open_lmdb`, which first walks the data
file with py-lmdb's verifier (``check_lmdb_file``: LMDB 0.9 trusts its page headers, and damage
there could kill the process with SIGBUS), then opens it with LMDB's exceptions translated,
without readahead unless the caller asks for it: LMDB reads through a memory map, and with
readahead every cold page fault maps the ~0.5 MiB the kernel read around it into the
process's resident set (MDB_NORDAHEAD sets MADV_RANDOM: the page alone), which for the
random point reads of a store is memory the process holds for nothing.
:func:`lmdb_errors` does that translation at every other boundary: a full disk is NoSpaceError,
a read-only one PermissionDeniedError, a damaged page CorruptionError naming the data file,
anything else StorageError. :func:`write_growing` commits one write transaction, doubling the
map and starting over when LMDB finds it full (the map is virtual: the file grows only with its
contents), so no store needs to guess its size.

:class:`LmdbWriter` is the optional writer of an async owner: blocking LMDB calls run on one
private thread, which is also what keeps LMDB's one-writer rule, and changes submitted while a
commit runs are group-committed in the next one (with ``sync=True`` each commit costs an fsync,
so N concurrent writers pay for about two, not N). A submitter returns once the transaction
holding its changes committed, or raises what the commit raised (none of them happened then).

Thread-safety: the functions are safe from any thread (LMDB itself allows one writer at a time).
LmdbWriter: loop thread only; its calls run, one at a time, on its own thread.
Invariants (LmdbWriter): changes are committed in submission order; every change submitted
before a commit starts is either in it or in a later one; one commit runs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import lmdb

from tiers.io.errors import (
    CorruptionError,
    NoSpaceError,
    PermissionDeniedError,
    StorageError,
    map_os_errors,
)
from tiers.storage.lmdb_records import check_lmdb_file

__all__ = ["LmdbWriter", "lmdb_errors", "open_lmdb", "write_growing"]

T = TypeVar("T")
# LMDB's ways of saying that a file is damaged. Incompatible: a database's flags changed (ours
# never do); BadTxn: LMDB failed the transaction on meeting a bad page (we never nest or reuse
# one); VersionMismatch: the meta page names another data format; BadChecksum: LMDB 1.0's.
_DAMAGE_NAMES = "Corrupted PageNotFound Invalid Incompatible BadTxn VersionMismatch BadChecksum"
_DAMAGE = tuple(
    getattr(lmdb, f"{n}Error") for n in _DAMAGE_NAMES.split() if hasattr(lmdb, n + "Error")
)


@contextlib.contextmanager
def lmdb_errors(path: str) -> Iterator[None]:
    """Translate LMDB's exceptions into the tierkit error tree; ``path``: the file to name."""
    try:
        yield
    except lmdb.Error as exc:
        message = f"LMDB: {exc}"
        if isinstance(exc, lmdb.DiskError):
            raise NoSpaceError(errno.ENOSPC, message, path) from exc
        if isinstance(exc, lmdb.ReadonlyError):
            raise PermissionDeniedError(errno.EROFS, message, path) from exc
        if isinstance(exc, _DAMAGE):
            raise CorruptionError(f"LMDB finds {path} damaged: {exc}", path) from exc
        raise StorageError(errno.EIO, message, path) from exc


def open_lmdb(
    path: str, *, map_bytes: int | None = None, check: bool = True, **options: Any
) -> Any:
    """Open the LMDB environment at ``path`` (``options``: those of ``lmdb.open``, with
    ``readahead=False`` unless given; a map of ``map_bytes``, LMDB's default when None).
    ``check``: verify the data file first (it reads all of it: for stores of metadata, not
    for data sets). Raises CorruptionError, StorageError."""
    options.setdefault("readahead", False)
    data_path = os.path.join(path, "data.mdb") if options.get("subdir", True) else path
    if check:
        check_lmdb_file(data_path)
    if map_bytes is not None:
        options["map_size"] = map_bytes
    with lmdb_errors(data_path), map_os_errors(path):
        return lmdb.open(path, **options)


def write_growing(env: Any, write: Callable[[Any], None]) -> None:
    """Run ``write(txn)`` in one write transaction of ``env`` and commit it, doubling the map
    and starting over whenever LMDB finds it full (the map is virtual: the file grows only with
    its contents). Call inside :func:`lmdb_errors`; one writer at a time, as LMDB requires."""
    while True:
        try:
            with env.begin(write=True) as txn:
                write(txn)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


class LmdbWriter(Generic[T]):
    """One private thread for an environment's blocking calls, and group commit of changes:
    ``commit(batch)`` (a coroutine, typically preparing the batch, then ``call``-ing the write
    transaction) is awaited for each batch of changes submitted meanwhile."""

    def __init__(self, commit: Callable[[list[T]], Awaitable[None]], name: str) -> None:
        self._commit = commit
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: list[tuple[T, asyncio.Future[None]]] = []
        self._committer: asyncio.Task[None] | None = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the writer's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def submit(self, changes: Iterable[T]) -> None:
        """Commit ``changes`` in one transaction (with others' submitted meanwhile); returns
        after it. Raises what the commit raised: none of its changes happened then."""
        future = asyncio.get_running_loop().create_future()
        before = len(self._pending)
        self._pending.extend((change, future) for change in changes)
        if len(self._pending) == before:
            return  # nothing to commit
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_loop())
        await future

    async def close(self) -> None:
        """Wait for the commits under way, then stop the thread (close the env before)."""
        await self.drain()
        self._executor.shutdown(wait=False)

    async def drain(self) -> None:
        while self._committer is not None and not self._committer.done():
            await asyncio.shield(self._committer)

    async def _commit_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._commit([change for change, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for _, future in batch:
                if not future.done():
                    future.set_result(None)
