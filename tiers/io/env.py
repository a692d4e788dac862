"""Env: the one seam through which tierkit makes blocking OS calls on files and directories.

Engines and tiers never call ``os.*`` file functions directly; they call an :class:`Env`: the
data path, and the namespace too (listing, making and removing names, renaming, the directory
lock), so an injected fault reaches every call a crash or a full disk could break. Tests
swap in a subclass that injects faults (short transfers, EIO, ENOSPC, a refused io_uring) to
reach error paths the real kernel rarely takes. The data path of
:class:`~tiers.io.uring.engine.UringEngine` is the kernel ring itself, so only its set-up
(``io_uring_setup``) goes through the Env.

Concurrency: stateless; every method may be called from any thread.
Errors: methods raise plain ``OSError``; callers translate at their boundary with
:func:`tiers.io.errors.map_os_errors`.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["Env", "default_env"]

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class Env:
    """POSIX file operations. Subclass and override a method to inject a fault."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def preadv(self, fd: int, buffers: Sequence[Any], offset_bytes: int) -> int:
        return os.preadv(fd, buffers, offset_bytes)

    def pwritev(self, fd: int, buffers: Sequence[Any], offset_bytes: int) -> int:
        return os.pwritev(fd, buffers, offset_bytes)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def file_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, size_bytes: int) -> None:
        os.ftruncate(fd, size_bytes)

    def allocate(self, fd: int, offset_bytes: int, size_bytes: int) -> None:
        os.posix_fallocate(fd, offset_bytes, size_bytes)

    def drop_cache(self, fd: int) -> None:
        """Ask the kernel to forget the file's cached pages (for cold-cache measurements)."""
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rename(self, source: str, target: str) -> None:
        """Atomically replace ``target`` by ``source`` (POSIX rename)."""
        os.replace(source, target)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        """Create ``path`` and its parents; an existing directory is fine."""
        os.makedirs(path, exist_ok=True)

    def lock(self, fd: int) -> None:
        """Take an exclusive, non-blocking flock; BlockingIOError when another owner holds it."""
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def io_uring_setup(self, entries: int, params_address: int) -> int:
        """Create an io_uring instance; returns its fd. Raises OSError (EPERM, ENOSYS, ...)."""
        # late: keeps ctypes out of the import path of Env users
        from tiers.io.uring import abi as _uring_abi

        return _uring_abi.io_uring_setup(entries, params_address)

    @staticmethod
    def direct_flag() -> int:
        """O_DIRECT on this platform (0 where it does not exist)."""
        return _O_DIRECT


default_env = Env()
