"""The loader's state dict: its own position keys plus torchdata StatefulDataLoader's names.

The position is ``(epoch, samples_consumed)`` at this rank, counted when a batch is handed to
the caller -- StatefulDataLoader's convention too: ``state_dict()`` reflects the batches
already yielded (never prefetched ones) and ``load_state_dict()`` applies to the next
``iter()``. Code written for StatefulDataLoader that saves the dict (``torch.save``, DCP),
reloads it into a loader built the same way and iterates, works unchanged; so does code that
reads its counters, under the same keys:

======================================  ==================================================
``_num_yielded``                        batches yielded in the current epoch
``_sampler_iter_yielded``               the same (the batch sampler's yields)
``_sampler_iter_state``                 ``{"samples_yielded", "epoch", "seed"}``
``_iterator_finished``                  the epoch is exhausted (the next iter() starts
                                        the next one)
``_base_seed``                          the workers' base seed
``_index_sampler_state``,               None: there is no sampler object, the order is a
``_shared_seed``                        pure function of ``(seed, epoch)``
======================================  ==================================================

Only our own keys are read back; the torchdata names are derived from them. Since the order
does not depend on the number of workers, a state resumes with any ``num_workers`` and
``worker_type`` (StatefulDataLoader needs the same count for iterable datasets).

Concurrency: pure functions.
"""

from __future__ import annotations

from typing import Any

from dataload.order import RankPlan
from tiers.io import InvalidArgumentError

__all__ = ["STATE_VERSION", "check_state", "make_state"]

STATE_VERSION = 1


def make_state(plan: RankPlan, epoch: int, consumed: int, base_seed: int) -> dict[str, Any]:
    """The state dict of a loader at ``(epoch, consumed)``."""
    yielded = -(-consumed // plan.batch_size)
    return {
        "version": STATE_VERSION,
        "seed": plan.seed,
        "epoch": epoch,
        "samples_consumed": consumed,
        "num_samples": plan.num_samples,
        "world_size": plan.world_size,
        "rank": plan.rank,
        "rank_remainder": plan.remainder,
        "shuffle": plan.shuffle,
        # torchdata StatefulDataLoader's names for the same position
        "_num_yielded": yielded,
        "_sampler_iter_yielded": yielded,
        "_sampler_iter_state": {"samples_yielded": consumed, "epoch": epoch, "seed": plan.seed},
        "_iterator_finished": consumed >= plan.samples_per_epoch,
        "_base_seed": base_seed,
        "_index_sampler_state": None,
        "_shared_seed": None,
    }


def check_state(state: dict[str, Any], plan: RankPlan) -> tuple[int, int]:
    """``(epoch, samples_consumed)`` of ``state`` for a loader with ``plan``.

    Raises:
        InvalidArgumentError: another version, dataset size, world size or shuffle mode, or a
            position outside the epoch.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        version = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise InvalidArgumentError(f"loader state version {version!r} unknown")
    for key, mine in (
        ("num_samples", plan.num_samples),
        ("world_size", plan.world_size),
        ("rank_remainder", plan.remainder),
        ("shuffle", plan.shuffle),
    ):
        if state[key] != mine:
            raise InvalidArgumentError(f"state has {key}={state[key]!r}, loader has {mine!r}")
    consumed, epoch = int(state["samples_consumed"]), int(state["epoch"])
    if epoch < 0 or not 0 <= consumed <= plan.samples_per_rank:
        raise InvalidArgumentError(f"state position epoch {epoch}, sample {consumed} invalid")
    return epoch, consumed
