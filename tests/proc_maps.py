"""Resident memory of one file's mappings in this process, read from ``/proc/self/smaps``.

Tests that bound how much of a file the process keeps resident (LMDB pages touched by reads)
share this reader. Linux only: callers skip where ``/proc/self/smaps`` is missing.
"""

from __future__ import annotations

from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path``, summed over every mapping of it."""
    total, inside = 0, False
    with open(SMAPS) as stream:
        for line in stream:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total
