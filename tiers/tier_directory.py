"""A persistent tier's directory: created when missing, locked to one owner, names made durable.

``lock_directory`` creates the directory and holds ``flock(LOCK_EX | LOCK_NB)`` on its ``LOCK``
file for as long as the returned descriptor is open. flock locks belong to an open file
description, so a second tier on the same directory is refused whether it is in another process
or this one, and the kernel drops the lock when the owner dies (kill -9 included).

``fsync_directory`` makes the names in a directory durable: a newly created file survives a
crash only once its directory has been fsynced, whatever fsync of the file itself promised.

Concurrency: plain blocking functions; call ``fsync_directory`` off the loop thread.
Invariants: while a lock descriptor is open, no other ``lock_directory`` of that directory
succeeds, in any process.
"""

from __future__ import annotations

import errno
import fcntl
import os

from tiers.env import Env
from tiers.errors import InvalidArgumentError, StorageError, map_os_errors

__all__ = ["fsync_directory", "lock_directory", "unlock_directory"]


def lock_directory(path: str) -> int:
    """Create ``path`` if needed and lock it; returns the descriptor that holds the lock.

    Raises:
        InvalidArgumentError: ``path`` exists and is not a directory.
        PermissionDeniedError: the directory cannot be created or written.
        StorageError: EBUSY when another owner holds the lock; other OS failures.
    """
    with map_os_errors(path):
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            raise InvalidArgumentError(f"{path!r} is not a directory") from None
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"{path!r} is not a directory")
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(errno.EBUSY, "directory is in use by another tier", path) from None
    return fd


def unlock_directory(fd: int) -> None:
    os.close(fd)  # closing the last descriptor of the open file description drops the flock


def fsync_directory(env: Env, path: str) -> None:
    """Make the names in directory ``path`` durable."""
    with map_os_errors(path):
        fd = env.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            env.fsync(fd)
        finally:
            env.close(fd)
