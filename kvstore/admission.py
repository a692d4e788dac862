"""AdmissionFilter: which blocks of a ``store`` are worth caching at all, learned from reuse.

Most KV blocks of a real conversation trace are used once (76% of the Mooncake conversation
trace's), and a block that will never be read again still pushes out one that would. The
filter sorts each stored block into a class, learns each class's reuse rate online, and
declines the blocks of a class whose rate is far below the average of all classes.

Class: a block's position from the end of the chain passed to ``store`` (0 for the last; 1;
2-3; 4 and more). The last block of a prompt is the one most likely to be private to its
request (in the Mooncake trace a prompt's last block is partial, so the next turn's differs:
1% of them are reused, 26% of the others); where the last block is reused like the others, as
with an engine that hashes only full blocks, the learned rates say so and nothing is declined.

Learning: every block offered (admitted or declined) enters a FIFO window of ``window_blocks``
recent blocks with its class; a lookup of a block still in the window (cached or not) counts
one reuse for its class and takes it out. Declined blocks are learned exactly like admitted
ones, so a class that starts being reused is admitted again (no self-fulfilling decline). The
counters halve every ``4 * window_blocks`` offers, so the rates follow a drifting workload.

Decision: class k is declined when at least ``min_reuses`` reuses have been seen in all,
``min_offers`` blocks of class k were offered, and its rate (reuses / offers) is below
``ratio`` times the rate of all classes together. The defaults (``ratio`` 0.5; the policy's
window half the capacity) were picked on the first half of the Mooncake trace alone
(benchmarks.kvstore.admission_sweep); every ratio from 0.1 to 0.5 declines the same class
there. Since a block is useless without its parent,
``admit_count`` admits the chain's blocks up to (not including) the first declined one.

Invariants: the window never holds more than ``window_blocks`` hashes; counters are >= 0.
Thread-safety: none; owned by one KVBlockStore policy (its loop thread).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from tiers import InvalidArgumentError

__all__ = ["CLASSES", "AdmissionFilter", "position_class"]

CLASSES = 4  # positions from the end of a stored chain: 0, 1, 2-3, 4+


def position_class(from_end: int) -> int:
    """The class of a block ``from_end`` places before the end of its stored chain."""
    if from_end < 2:
        return from_end
    return 2 if from_end < 4 else 3


class AdmissionFilter:
    """Learned admission of stored blocks; see the module docstring."""

    def __init__(
        self,
        window_blocks: int = 4096,
        *,
        ratio: float = 0.5,
        min_reuses: int = 32,
        min_offers: int = 64,
    ) -> None:
        if window_blocks < 1 or not 0.0 <= ratio <= 1.0 or min_reuses < 0 or min_offers < 0:
            raise InvalidArgumentError(
                f"bad admission parameters: window_blocks={window_blocks}, ratio={ratio}, "
                f"min_reuses={min_reuses}, min_offers={min_offers}"
            )
        self.window_blocks = window_blocks
        self.ratio = ratio
        self.min_reuses = min_reuses
        self.min_offers = min_offers
        self._window: OrderedDict[bytes, int] = OrderedDict()  # hash -> class, oldest first
        self.offers = [0.0] * CLASSES
        self.reuses = [0.0] * CLASSES
        self._since_decay = 0
        self.declined_blocks = 0

    def declines(self, klass: int) -> bool:
        """Whether blocks of ``klass`` are declined now."""
        total_offers = sum(self.offers)
        total_reuses = sum(self.reuses)
        if total_reuses < self.min_reuses or self.offers[klass] < self.min_offers:
            return False
        mean_rate = total_reuses / total_offers
        return self.reuses[klass] < self.ratio * mean_rate * self.offers[klass]

    def admit_count(self, chain_length: int, fresh_slots: Sequence[int]) -> int:
        """How many of ``fresh_slots`` (positions in a stored chain of ``chain_length``
        blocks, ascending) to admit: those before the first of a declined class."""
        for count, slot in enumerate(fresh_slots):
            if self.declines(position_class(chain_length - 1 - slot)):
                return count
        return len(fresh_slots)

    def offered(self, blocks: Iterable[tuple[bytes, int]], admitted: int) -> None:
        """Record the offered (hash, slot-from-end) blocks, the first ``admitted`` of which
        were cached (the others declined)."""
        offered = 0
        for block_hash, from_end in blocks:
            klass = position_class(from_end)
            self.offers[klass] += 1
            self._window[block_hash] = klass
            self._window.move_to_end(block_hash)
            offered += 1
        self.declined_blocks += max(0, offered - admitted)
        while len(self._window) > self.window_blocks:
            self._window.popitem(last=False)
        self._since_decay += offered
        if self._since_decay >= 4 * self.window_blocks:
            self._since_decay = 0
            self.offers = [value / 2 for value in self.offers]
            self.reuses = [value / 2 for value in self.reuses]

    def looked_up(self, hashes: Iterable[bytes]) -> None:
        """A lookup asked for ``hashes`` (hit or miss): each one still in the window counts
        a reuse of its class."""
        window = self._window
        for block_hash in hashes:
            klass = window.pop(block_hash, None)
            if klass is not None:
                self.reuses[klass] += 1

    def rates(self) -> list[float | None]:
        """Each class's learned reuse rate (None before any offer)."""
        return [r / o if o else None for r, o in zip(self.reuses, self.offers, strict=True)]
