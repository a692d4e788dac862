"""The epoch order: a pure function of (seed, epoch) over the whole dataset, sliced per rank.

Every rank computes the same global permutation from ``(seed, epoch)`` alone (numpy's PCG64
seeded with a fixed domain word, the seed and the epoch; ``shuffle=False`` gives ``0..n-1``),
then takes the strided slice ``order[rank::world_size]`` of it. Before slicing, the order is made
a multiple of ``world_size``: ``"pad"`` appends the first ``world_size - num_samples %
world_size`` samples of the order again (every sample is seen, those twice), ``"drop"`` leaves
out the last ``num_samples % world_size`` (each sample at most once). Either way every rank gets
the same number of samples, so DDP never waits on a rank with fewer batches; ``drop_last`` then
trims a short last batch the same way at every rank.

Positions inside an epoch are counted in samples of this rank's share, so a resume replays
nothing: ``RankPlan.indices(epoch)`` recomputes the epoch's order (one permutation, which the
loader keeps per epoch) and the loader slices it from the saved position.

Concurrency: everything here is immutable after construction; safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from tiers.io import InvalidArgumentError

__all__ = ["RankPlan", "RankRemainder", "epoch_order", "rank_slice"]

RankRemainder = Literal["pad", "drop"]
_SEED_DOMAIN = 0x7469657273  # keeps the loader's stream apart from other uses of the same seed


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The global order of epoch ``epoch``: int64[num_samples], a permutation of its indices."""
    if num_samples < 0 or epoch < 0 or seed < 0:
        raise InvalidArgumentError(
            f"num_samples, seed and epoch must be >= 0 (got {num_samples}, {seed}, {epoch})"
        )
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([_SEED_DOMAIN, seed, epoch]))
    return rng.permutation(num_samples).astype(np.int64, copy=False)


def rank_slice(
    order: np.ndarray, rank: int, world_size: int, remainder: RankRemainder = "pad"
) -> np.ndarray:
    """Rank ``rank``'s disjoint share of ``order``; every rank's share has the same length."""
    if world_size <= 0 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank {rank} is not in a world of size {world_size}")
    if remainder not in ("pad", "drop"):
        raise InvalidArgumentError(f"remainder must be 'pad' or 'drop', got {remainder!r}")
    extra = len(order) % world_size
    if extra and remainder == "drop":
        order = order[: len(order) - extra]
    elif extra:
        if not len(order):
            raise InvalidArgumentError("cannot pad an empty dataset")
        missing = world_size - extra
        order = np.concatenate([order, np.resize(order, missing)])
    return order[rank::world_size]


@dataclass(frozen=True)
class RankPlan:
    """Where one rank's batches come from: sizes, counts, and the indices of any batch.

    ``drop_last`` is DataLoader's: drop this rank's last batch when it is short.
    """

    num_samples: int
    batch_size: int
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    remainder: RankRemainder = "pad"
    drop_last: bool = False
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be positive, got {self.batch_size}")
        if self.num_samples <= 0:
            raise InvalidArgumentError("the source has no samples")
        rank_slice(np.arange(1), 0, 1, self.remainder)  # validates remainder
        if self.world_size <= 0 or not 0 <= self.rank < self.world_size:
            raise InvalidArgumentError(f"rank {self.rank} is not in a world of {self.world_size}")

    @property
    def samples_per_rank(self) -> int:
        """Samples of one epoch at each rank (before ``drop_last``)."""
        whole, extra = divmod(self.num_samples, self.world_size)
        return whole + (1 if extra and self.remainder == "pad" else 0)

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank yields per epoch (after ``drop_last``)."""
        if self.drop_last:
            return self.samples_per_rank // self.batch_size * self.batch_size
        return self.samples_per_rank

    def __len__(self) -> int:
        """Batches per epoch at this rank (the same at every rank)."""
        return -(-self.samples_per_epoch // self.batch_size)

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's whole epoch, in order (its first ``samples_per_epoch`` are used)."""
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        share = rank_slice(order, self.rank, self.world_size, self.remainder)
        return share[: self.samples_per_epoch]
