"""VectorFile: the point store's vectors, in a plain file read with ``pread``, not mapped.

Why not beside the payload in LMDB: a stored vector (1.5 KiB at 384 dimensions) made every
point record about one LMDB page, and LMDB reads through its memory map, so every page a
write or a read touched stayed in the server's resident set; the kernel maps the pages around
a fault too (fault-around, 64 KiB, whatever ``madvise`` says), and new records are written
side by side. A soak adding points grew the resident set by about a page per point (issue 16:
+21.8 MiB of the map for 5,768 points in 150 s). Here a vector is read into a fresh array only
when a caller asks for it (``with_vector``, the index replaying an intent, an exact scan); the
file's pages stay in the page cache, shared and reclaimable, not in the process.

Layout (``<points>/vectors.dat``): two slots per internal id, ``dim x 4`` bytes each
(float32 LE), at ``(2 x id + side) x dim x 4``. A point's record (point_records.py) names its
side and the CRC-32 of its slot; a write puts a changed vector in the side its committed
record does not name, syncs the file, then commits the record: a crash before the commit
leaves the committed record and its slot untouched, so no acknowledged vector is ever
overwritten in place and the file does not grow with overwrites (ids are never reused; a
deleted point's slots are left as they are).

Thread-safety: ``read`` from any thread (``os.pread``); ``write``/``sync`` from the store's
writer thread only. A reader that read a record before two later overwrites of the same point
committed can find its slot rewritten: ``read`` says so (VectorChanged) and the store reads
the record again.
"""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from tiers.io import CorruptionError, default_env, map_os_errors
from tiers.storage import fsync_directory

__all__ = ["VectorChanged", "VectorFile", "vector_crc"]

_SIDE = struct.Struct(">QB")


class VectorChanged(Exception):
    """The slot no longer holds the vector its record named (rewritten since, or damaged)."""


def vector_crc(internal_id: int, side: int, data: bytes) -> int:
    """CRC-32 of the slot's bytes, seeded with its id and side (a misplaced slot fails too)."""
    return zlib.crc32(data, zlib.crc32(_SIDE.pack(internal_id, side)))


class VectorFile:
    def __init__(self, path: str) -> None:
        self.path = path
        created = not os.path.exists(path)
        with map_os_errors(path):
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if created:  # its name must outlive a power cut before any record names a slot
                fsync_directory(default_env, os.path.dirname(path) or ".")
        self._dirty = False

    def write(self, internal_id: int, side: int, data: bytes) -> None:
        """Put ``data`` (one vector's bytes) in the slot; durable after :meth:`sync`."""
        with map_os_errors(self.path):
            os.pwrite(self._fd, data, (2 * internal_id + side) * len(data))
        self._dirty = True

    def sync(self) -> None:
        """Make every slot written so far durable (before the records naming them commit)."""
        if self._dirty:
            with map_os_errors(self.path):
                os.fdatasync(self._fd)
            self._dirty = False

    def read(self, internal_id: int, side: int, crc: int, dim: int) -> np.ndarray:
        """The float32 vector in the slot. VectorChanged if it fails ``crc``."""
        size = 4 * dim
        with map_os_errors(self.path):
            data = os.pread(self._fd, size, (2 * internal_id + side) * size)
        if len(data) != size or vector_crc(internal_id, side, data) != crc:
            raise VectorChanged(internal_id)
        return np.frombuffer(data, dtype="<f4").astype(np.float32)

    def damaged(self, internal_id: int) -> CorruptionError:
        return CorruptionError(
            f"the vector of internal id {internal_id} fails its checksum in {self.path}",
            self.path,
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
