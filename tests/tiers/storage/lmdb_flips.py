"""Bit rot for LMDB files: where a key's record lies in ``data.mdb``, and copies of the
environment with one byte of it flipped.

LMDB is copy-on-write, so a file holds the live copy of a record and possibly stale copies in
freed pages; :func:`node_regions` finds every copy, and a test that flips all of them is sure
to have hit the live one.
"""

from __future__ import annotations

import random
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

__all__ = ["flipped_copies", "node_regions"]

_NODE_HEADER = struct.Struct("<HHHH")  # value size lo, hi, flags, key size (LMDB 0.9 MDB_node)
_F_BIGDATA = 0x01  # the value lives on overflow pages; the node holds its page number


def node_regions(data: bytes, key: bytes) -> list[range]:
    """Byte ranges (key, then inline value) of every leaf node holding ``key`` in ``data``."""
    regions = []
    at = data.find(key, _NODE_HEADER.size)
    while at >= 0:
        lo, hi, flags, key_size = _NODE_HEADER.unpack_from(data, at - _NODE_HEADER.size)
        if key_size == len(key):
            value_size = 8 if flags & _F_BIGDATA else lo | hi << 16
            regions.append(range(at, at + len(key) + value_size))
        at = data.find(key, at + 1)
    return regions


def flipped_copies(
    source: Path, offsets: list[int], scratch: Path, seed: int = 0, mask: int | None = None
) -> Iterator[tuple[int, Path]]:
    """For each offset, ``scratch`` holding a copy of the environment in ``source`` whose
    ``data.mdb`` has that byte XORed with ``mask`` (default: a nonzero one drawn from ``seed``,
    so every run flips the same bits). One copy at a time: use each before the next."""
    pristine = (source / "data.mdb").read_bytes()
    masks = random.Random(seed)
    for offset in offsets:
        damaged = bytearray(pristine)
        damaged[offset] ^= mask or masks.randrange(1, 256)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        (scratch / "data.mdb").write_bytes(bytes(damaged))
        yield offset, scratch


def delete_behind_its_back(source: Path, target: Path, key: bytes, db: bytes | None) -> Path:
    """A copy of the environment in ``source`` at ``target`` with ``key`` deleted from ``db``
    (None: the default database) by plain LMDB, as a lost record would look."""
    import lmdb

    target.mkdir()
    (target / "data.mdb").write_bytes((source / "data.mdb").read_bytes())
    env = lmdb.open(str(target), subdir=True, max_dbs=2)
    with env.begin(write=True) as txn:
        assert txn.delete(key, db=None if db is None else env.open_db(db, txn=txn))
    env.close()
    return target
