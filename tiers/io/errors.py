"""The tierkit error tree: every failure a caller of `tiers` can see.

Foreign errors (``OSError`` from the kernel, errno values from io_uring completions) are
translated once, where they cross into tierkit, by :func:`map_os_errors` or
:func:`error_from_errno`. Nothing above that boundary catches bare ``OSError``.

::

    TierkitError
     +- InvalidArgumentError (ValueError)       bad input, caught before any I/O
     |   +- AlignmentError                      O_DIRECT offset/length/address not aligned
     |   +- DirectIOUnsupportedError            the filesystem refuses O_DIRECT
     |   +- ConfigError                         a setting that is wrong or cannot fit here
     +- EngineClosedError (RuntimeError)        the engine or file was closed
     +- EngineUnavailableError (RuntimeError)   a backend cannot run here (no io_uring, no CUDA)
     +- StorageError (OSError)                  the OS failed an operation; keeps errno and path
     |   +- NoSpaceError                        ENOSPC / EDQUOT
     |   +- NoMemoryError                       ENOMEM: a tier's arena cannot be allocated
     |   +- FileMissingError                    ENOENT
     |   +- PermissionDeniedError               EACCES / EPERM / EROFS
     |   +- UnexpectedEOFError                  a read that had to be full ended at EOF
     +- CorruptionError                         bytes on disk fail their checksum or format
     +- CapacityError                           a tier or the whole store is full

Every :class:`StorageError` carries ``errno``, ``strerror``, ``filename`` (the path) and, when
known, ``offset_bytes``. A failed batch raises the first failure after *every* request of the
batch has finished (the caller's buffers are never written after the exception), with the
per-request outcome in ``batch_results``.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
from collections.abc import Iterator

__all__ = [
    "AlignmentError",
    "CapacityError",
    "ConfigError",
    "CorruptionError",
    "DirectIOUnsupportedError",
    "EngineClosedError",
    "EngineUnavailableError",
    "FileMissingError",
    "InvalidArgumentError",
    "NoMemoryError",
    "NoSpaceError",
    "PermissionDeniedError",
    "StorageError",
    "TierkitError",
    "UnexpectedEOFError",
    "error_from_errno",
    "map_os_errors",
]


class TierkitError(Exception):
    """Root of every error tierkit raises on purpose."""


class InvalidArgumentError(TierkitError, ValueError):
    """The caller passed something unusable; detected before any I/O was issued."""


class AlignmentError(InvalidArgumentError):
    """An O_DIRECT request whose offset, length or buffer address is not aligned."""


class DirectIOUnsupportedError(InvalidArgumentError):
    """The filesystem holding ``path`` does not support O_DIRECT."""

    def __init__(self, path: str) -> None:
        super().__init__(f"O_DIRECT is not supported by the filesystem holding {path!r}")
        self.path = path


class ConfigError(InvalidArgumentError):
    """A configuration setting that is invalid, or asks for more than this machine has.

    ``where`` names the setting (``tiers[1].write_through``, ``IndexConfig.dim``); the message
    starts with it.
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message if where is None else f"{where}: {message}")
        self.where = where


class EngineClosedError(TierkitError, RuntimeError):
    """The engine (or the file handle) was closed before or while the request was made."""


class EngineUnavailableError(TierkitError, RuntimeError):
    """A backend cannot run on this machine; ``reason`` says why."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"{backend} unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class StorageError(TierkitError, OSError):
    """An operating-system failure, with errno, path and (when known) file offset."""

    def __init__(
        self,
        errno: int,
        strerror: str,
        filename: str | None = None,
        offset_bytes: int | None = None,
    ) -> None:
        super().__init__(errno, strerror, filename)
        self.offset_bytes = offset_bytes
        self.batch_results: list[int | BaseException] | None = None

    def __str__(self) -> str:
        where = f" at offset {self.offset_bytes}" if self.offset_bytes is not None else ""
        name = errno_mod.errorcode.get(self.errno or 0, str(self.errno))
        return f"[{name}] {self.strerror}: {self.filename!r}{where}"

    def __reduce__(self):  # pickling keeps the subclass and the offset
        return (type(self), (self.errno, self.strerror, self.filename, self.offset_bytes))


class NoSpaceError(StorageError):
    """The device or quota is full (ENOSPC, EDQUOT)."""


class NoMemoryError(StorageError):
    """The OS or device could not provide memory (ENOMEM); an arena's error names its tier in
    the message and has no ``filename``."""

    def __str__(self) -> str:
        if self.filename is None:
            return f"[ENOMEM] {self.strerror}"
        return super().__str__()


class FileMissingError(StorageError):
    """The path does not exist (ENOENT)."""


class PermissionDeniedError(StorageError):
    """The OS refused access (EACCES, EPERM, EROFS)."""


class UnexpectedEOFError(StorageError):
    """A read that had to fill its buffer reached end of file first."""


class CorruptionError(TierkitError):
    """Stored bytes fail their checksum or format check; never returned as data."""

    def __init__(self, message: str, path: str | None = None, offset_bytes: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset_bytes = offset_bytes


class CapacityError(TierkitError):
    """No tier has room for the object, even after eviction."""


_BY_ERRNO: dict[int, type[StorageError]] = {
    errno_mod.ENOSPC: NoSpaceError,
    errno_mod.EDQUOT: NoSpaceError,
    errno_mod.ENOMEM: NoMemoryError,
    errno_mod.ENOENT: FileMissingError,
    errno_mod.EACCES: PermissionDeniedError,
    errno_mod.EPERM: PermissionDeniedError,
    errno_mod.EROFS: PermissionDeniedError,
}


def error_from_errno(
    err: int, path: str | None = None, offset_bytes: int | None = None
) -> StorageError:
    """Build the typed error for a positive errno value (e.g. ``-cqe.res``)."""
    cls = _BY_ERRNO.get(err, StorageError)
    return cls(err, os.strerror(err), path, offset_bytes)


@contextlib.contextmanager
def map_os_errors(path: str | None = None, offset_bytes: int | None = None) -> Iterator[None]:
    """Translate an ``OSError`` raised inside the block into the tierkit error tree."""
    try:
        yield
    except TierkitError:
        raise
    except OSError as exc:
        if exc.errno is None:
            raise StorageError(errno_mod.EIO, str(exc), path, offset_bytes) from exc
        raise error_from_errno(exc.errno, path or exc.filename, offset_bytes) from exc
