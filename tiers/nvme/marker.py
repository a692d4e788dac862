"""The tier format marker file (``<tier dir>/FORMAT``; bytes in tiers.nvme.format): read or make.

A directory whose catalog predates the marker is a format-1 tier: every record in it has a
header. :func:`load_marker` then writes a marker whose ``bare_from_version`` is the catalog's
next version, so the records already there keep being read as header records and only puts from
now on may be bare. The marker is made durable (temporary file, fsync, rename, directory fsync)
before the tier opens, so no bare record can be committed while a crash could still lose it.

Concurrency: blocking file calls through the tier's Env; run them on the blocking executor.
Invariants: once written, a marker never changes.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib

from tiers.io.env import Env
from tiers.io.errors import CorruptionError, map_os_errors
from tiers.storage.directory import fsync_directory

__all__ = ["MARKER_BYTES", "MARKER_NAME", "load_marker", "pack_marker", "parse_marker"]

MARKER_NAME = "FORMAT"
TIER_FORMAT = 2
MARKER_MAGIC = b"TKNF"
MARKER_BYTES = 32
_MARKER = struct.Struct("<4sIQ12x")  # bytes [0, 28); the marker CRC follows at 28
_CRC = struct.Struct("<I")
assert _MARKER.size + _CRC.size == MARKER_BYTES


def pack_marker(bare_from_version: int) -> bytes:
    """The 32 bytes of a tier format marker."""
    body = _MARKER.pack(MARKER_MAGIC, TIER_FORMAT, bare_from_version)
    return body + _CRC.pack(zlib.crc32(body))


def parse_marker(raw: bytes, path: str) -> int:
    """``bare_from_version`` of a marker. Raises CorruptionError naming ``path``."""
    if len(raw) != MARKER_BYTES:
        raise CorruptionError(f"tier format marker of {len(raw)} bytes", path)
    magic, tier_format, bare_from = _MARKER.unpack_from(raw)
    (stored_crc,) = _CRC.unpack_from(raw, _MARKER.size)
    if magic != MARKER_MAGIC or zlib.crc32(raw[: _MARKER.size]) != stored_crc:
        raise CorruptionError("tier format marker damaged", path)
    if tier_format != TIER_FORMAT:
        raise CorruptionError(f"unknown tier format {tier_format}", path)
    return int(bare_from)


def load_marker(env: Env, directory: str, next_version: int) -> int:
    """``bare_from_version`` of the tier in ``directory``, writing the marker first when the
    directory has none (``next_version``: the catalog's, above every committed version).

    Raises: CorruptionError (a damaged marker), StorageError.
    """
    path = os.path.join(directory, MARKER_NAME)
    with map_os_errors(path):
        try:
            fd = env.open(path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                raw = os.pread(fd, MARKER_BYTES + 1, 0)
            finally:
                env.close(fd)
            return parse_marker(raw, path)
        temporary = path + ".tmp"
        fd = env.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = pack_marker(next_version)
            if env.pwritev(fd, [data], 0) != len(data):
                raise OSError(errno.EIO, "short write of the tier format marker")
            env.fsync(fd)
        finally:
            env.close(fd)
        env.rename(temporary, path)
    fsync_directory(env, directory)
    return next_version
