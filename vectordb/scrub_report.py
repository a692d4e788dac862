"""What ``SpannIndex.verify()`` found and what ``repair()`` did: plain data, no I/O.

Thread-safety: built once by the scrub, then read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RepairReport", "ScrubReport"]


@dataclass
class ScrubReport:
    """Every posting list read and checked once.

    ``bad_records`` maps each corrupt list to the numbers (0-based, within the list) of its
    records that fail their check."""

    lists_checked: int = 0
    records_checked: int = 0
    bytes_read: int = 0
    bad_records: dict[int, list[int]] = field(default_factory=dict)

    @property
    def corrupt_lists(self) -> list[int]:
        return sorted(self.bad_records)

    @property
    def ok(self) -> bool:
        """True when every record of every list passed its check."""
        return not self.bad_records


@dataclass
class RepairReport:
    """A repair: the scrub it started from, and what it rebuilt.

    A corrupt list is rebuilt from its records that verify plus, for each bad record whose id
    and version still name a live vector, that vector's copy from another list (SPANN keeps
    replicas). ``unrecovered`` maps each rebuilt list to the bad records it had to drop (their
    id unreadable or no verified copy elsewhere); ``lost_ids`` are live vectors with no
    verified copy left in any list: searches cannot find them until they are inserted again."""

    scrub: ScrubReport
    repaired_lists: list[int] = field(default_factory=list)
    records_recovered: int = 0
    unrecovered: dict[int, list[int]] = field(default_factory=dict)
    lost_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def complete(self) -> bool:
        """True when every live vector has a verified copy again."""
        return len(self.lost_ids) == 0
