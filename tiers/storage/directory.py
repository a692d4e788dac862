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
import os

from tiers.io.env import Env, default_env
from tiers.io.errors import InvalidArgumentError, StorageError, map_os_errors

__all__ = ["fsync_directory", "lock_directory", "unlock_directory"]


def lock_directory(path: str, env: Env = default_env) -> int:
    """Create ``path`` if needed and lock it; returns the descriptor that holds the lock.
    Every OS call goes through ``env``.

    Raises:
        InvalidArgumentError: ``path`` exists and is not a directory.
        PermissionDeniedError: the directory cannot be created or written.
        StorageError: EBUSY when another owner holds the lock; other OS failures.
    """
    with map_os_errors(path):
        try:
            env.makedirs(path)
        except FileExistsError:
            raise InvalidArgumentError(f"{path!r} is not a directory") from None
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"{path!r} is not a directory")
        fd = env.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        env.lock(fd)
    except OSError as exc:
        env.close(fd)
        if isinstance(exc, BlockingIOError):
            raise StorageError(errno.EBUSY, "directory is in use by another tier", path) from None
        with map_os_errors(path):
            raise
    return fd


def unlock_directory(fd: int, env: Env = default_env) -> None:
    env.close(fd)  # closing the last descriptor of the open file description drops the flock


def fsync_directory(env: Env, path: str) -> None:
    """Make the names in directory ``path`` durable."""
    with map_os_errors(path):
        fd = env.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            env.fsync(fd)
        finally:
            env.close(fd)
