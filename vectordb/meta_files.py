"""The checkpoint's array files (vectordb/meta.py): a ``.npy`` file written durably with its
CRC-32 computed on the way out, and read back once into its final array with the CRC checked on
the way in.

Why files and not LMDB values: meta.py's docstring. Reads use ``readinto`` (no mapping), so the
pages stay in the kernel's page cache, not in the process. A narrowed read converts a piece of
``READ_STEP_BYTES`` at a time: the peak is the final array plus one piece.

Thread-safety: plain functions on their own file objects.
"""

from __future__ import annotations

import io
import os
import zlib
from typing import Any

import numpy as np

from tiers.io import CorruptionError

__all__ = ["READ_STEP_BYTES", "read_npy", "write_npy"]

READ_STEP_BYTES = 4 << 20


class _CrcWriter:
    """A file's ``write`` that keeps the CRC-32 and length of what went through it."""

    def __init__(self, file: Any) -> None:
        self.file, self.crc, self.nbytes = file, 0, 0

    def write(self, data: Any) -> None:
        self.crc = zlib.crc32(data, self.crc)
        self.nbytes += memoryview(data).nbytes
        self.file.write(data)


def write_npy(path: str, array: np.ndarray) -> tuple[int, int]:
    """Write ``array`` as a durable ``.npy`` file (fsynced); its (length, CRC-32)."""
    with open(path, "xb") as file:
        writer = _CrcWriter(file)
        # through a wrapper numpy writes buffered pieces, never a whole copy of the array
        np.lib.format.write_array(writer, array, allow_pickle=False)
        file.flush()
        os.fsync(file.fileno())
    return writer.nbytes, writer.crc


def read_npy(path: str, name: str, nbytes: int, crc: int, as_dtype: Any) -> np.ndarray:
    """The array of a ``.npy`` file written by :func:`write_npy`, read once into its final
    place (converted to ``as_dtype`` a piece at a time when given); CorruptionError naming
    the file and ``name`` if its length or CRC-32 differs from the record's."""

    def corrupt(what: str) -> CorruptionError:
        return CorruptionError(f"checkpoint array {name!r} {what} in {path}", path)

    if not os.path.exists(path):
        raise corrupt("is missing")
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size != nbytes:
            raise corrupt(f"is not {nbytes} bytes long")
        head_bytes = file.read(min(nbytes, 1 << 16))
        head = io.BytesIO(head_bytes)
        try:
            version = np.lib.format.read_magic(head)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, stored = read_header(head)
        except (ValueError, EOFError):
            raise corrupt("is not an array") from None
        count = int(np.prod(shape, dtype=np.int64))
        if stored.hasobject or head.tell() + count * stored.itemsize != nbytes:
            raise corrupt("is not an array")
        running = zlib.crc32(head_bytes[: head.tell()])
        file.seek(head.tell())
        out = np.empty(count, as_dtype or stored)
        # the same dtype: straight into the array's own memory; else through one piece
        scratch = out if out.dtype == stored else np.empty(0, stored)
        step = max(1, READ_STEP_BYTES // max(stored.itemsize, 1))
        got = 0
        for first in range(0, count, step):
            n = min(step, count - first)
            if scratch is out:
                piece = out[first : first + n]
            else:
                scratch = scratch if len(scratch) >= n else np.empty(n, stored)
                piece = scratch[:n]
            view = piece.data.cast("B")
            read = file.readinto(view) or 0  # a short read: the file was cut under us
            running = zlib.crc32(view[:read], running)
            got += read
            if read < len(view):
                break
            if scratch is not out:
                out[first : first + n] = piece
    if got != count * stored.itemsize or running != crc:
        raise corrupt("fails its checksum")
    if fortran:
        return out.reshape(shape, order="F")
    return out.reshape(shape)
