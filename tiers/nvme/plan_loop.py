"""plan_whole: a get_many batch of whole bare records, planned into engine rows in one numba call.

Why: at 4 KiB a batch of 32 spent ~150 us of Python and ~60 small numpy calls (record kinds,
totals, staging offsets, destination checks, overlap sort, the engine's validation) before its
first byte moved; here one compiled pass over the batch's entries and destinations decides
whether the batch is the common one and, if so, writes its rows.

The common batch (the only one this plans; anything else returns a negative code and the caller
takes the general planner, tiers.nvme.batch_reads, which handles it or raises its typed error):
every entry is a *bare* record (version >= ``bare_from``, size a positive multiple of
``RECORD_ALIGNMENT_BYTES``, no chunk extension: the caller checks that), all in one extent file,
at a page-aligned offset; every destination is page-aligned, holds at least its record, and no
two destinations share a byte. Such a batch needs no staging, no copy and no alignment check by
the engine (``IOBatch.validate`` would find nothing): each record is read straight into its
destination and checked there afterwards (tiers.nvme.crc_loop.check_rows).

Concurrency: ``nogil``, pure over caller-owned arrays. Invariants: on a return >= 0 (the file
index) every output row ``i < m`` is written; on a negative return the outputs are unspecified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["NOT_COMMON", "plan_whole"]

NOT_COMMON = -1  # the batch is not the common one: plan it the general way


@njit(nogil=True, cache=True)
def plan_whole(
    flat: Any, dest_addresses: Any, dest_bytes: Any, bare_from: int, page_bytes: int,
    max_bytes: int, stride: int, offsets: Any, lengths: Any, crcs: Any, pins: Any,
) -> int:  # fmt: skip  # pragma: no cover - machine code
    """Plan the ``m = len(dest_addresses)`` rows of ``flat`` (int64[5 m]: file, offset, size,
    crc32, version per entry). Writes ``offsets``, ``lengths``, ``crcs`` and ``pins`` (the
    ExtentSpace address of each record); returns the batch's file index or NOT_COMMON."""
    m = dest_addresses.shape[0]
    mask = page_bytes - 1
    file = flat[0]
    for i in range(m):
        at = 5 * i
        offset, size = flat[at + 1], flat[at + 2]
        if flat[at] != file or flat[at + 4] < bare_from:
            return NOT_COMMON
        if size <= 0 or size > max_bytes or (size | offset) & mask or offset < 0:
            return NOT_COMMON
        address = dest_addresses[i]
        if address & mask or dest_bytes[i] < size:
            return NOT_COMMON
        offsets[i] = offset
        lengths[i] = size
        crcs[i] = flat[at + 3]
        pins[i] = file * stride + offset
    if m > 1:
        order = np.argsort(dest_addresses)
        for j in range(1, m):
            before, after = order[j - 1], order[j]
            if dest_addresses[before] + lengths[before] > dest_addresses[after]:
                return NOT_COMMON  # destinations share bytes: staged and copied in key order
    return file
