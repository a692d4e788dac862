"""Shared pieces of the NVMe tier tests: damage one byte of a stored record in place."""

from __future__ import annotations

import os

from tiers.nvme import NvmeTier


def flip_byte(tier: NvmeTier, key: str, at: int, mask: int = 0x20) -> None:
    """XOR the byte ``at`` bytes into ``key``'s record on disk with ``mask``, and sync it."""
    located = tier.locate(key)
    assert located is not None
    path, offset = located
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset + at)
        os.pwrite(fd, bytes([byte[0] ^ mask]), offset + at)
        os.fsync(fd)
    finally:
        os.close(fd)
