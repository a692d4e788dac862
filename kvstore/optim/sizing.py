"""How big an OffloadedOptimizer's subgroups are and how many staging slots it gets.

The read / step / write pipeline (pipeline.py) overlaps only between subgroups: the first
subgroup's read and the last one's write run alone, so with a handful of subgroups the fill and
drain are a large share of a step (100M fp32 parameters in 64 MiB subgroups are ~6 subgroups,
and the step was 2.3x fio's floor). ``subgroup_bytes=None`` therefore sizes subgroups from the
model: about ``TARGET_SUBGROUPS`` of them, never smaller than ``MIN_SUBGROUP_BYTES`` (below
that the per-subgroup cost of an inner optimizer, a durable write and a future per object
shows, and the I/O requests get small) nor larger than ``MAX_SUBGROUP_BYTES`` (more buys no
overlap and costs host memory), and small enough that the staging slots fit in
``host_budget_bytes`` when one is given. A model smaller than one minimum subgroup is one
subgroup.

Thread-safety: pure functions.
"""

from __future__ import annotations

from kvstore.optim.layout import PAGE_ELEMS, OffloadError

__all__ = [
    "MAX_SLOTS",
    "MAX_SUBGROUP_BYTES",
    "MIN_SUBGROUP_BYTES",
    "TARGET_SUBGROUPS",
    "auto_subgroup_bytes",
    "staging_slots",
]

# read two ahead, step, write behind (pipeline.depth): the second read in flight kept a 200M
# step at 1.96 s vs 2.84 s with 3 slots in one back-to-back round (noisy disk; RESULTS.md)
MAX_SLOTS = 4
TARGET_SUBGROUPS = 16
MIN_SUBGROUP_BYTES = 8 << 20
MAX_SUBGROUP_BYTES = 64 << 20
_PAGE_BYTES = PAGE_ELEMS * 4


def auto_subgroup_bytes(
    master_bytes: int, stored_sections: int, host_budget_bytes: int | None = None
) -> int:
    """fp32 master bytes per subgroup for a model of ``master_bytes`` (4 per element) whose
    subgroup objects hold ``stored_sections`` sections: ``master_bytes / TARGET_SUBGROUPS``
    clamped to [MIN, MAX], lowered to fit ``MAX_SLOTS`` objects plus one subgroup of gradients
    in ``host_budget_bytes``; whole pages."""
    wanted = min(MAX_SUBGROUP_BYTES, max(MIN_SUBGROUP_BYTES, master_bytes // TARGET_SUBGROUPS))
    if host_budget_bytes is not None:
        # per subgroup byte of master: MAX_SLOTS objects of stored_sections, one of gradients
        wanted = min(wanted, host_budget_bytes // (MAX_SLOTS * stored_sections + 1))
    return max(_PAGE_BYTES, wanted // _PAGE_BYTES * _PAGE_BYTES)


def staging_slots(
    subgroups: int, object_bytes: int, grad_bytes: int, host_budget_bytes: int | None
) -> int:
    """Slots of ``object_bytes`` the staging gets: ``MAX_SLOTS`` (no more than there are
    subgroups) or as many as ``host_budget_bytes`` holds beside the gradient buffer."""
    budget = host_budget_bytes or MAX_SLOTS * object_bytes + grad_bytes
    slots = min(MAX_SLOTS, max(1, subgroups), (budget - grad_bytes) // object_bytes)
    if slots < 1:
        raise OffloadError(
            f"host_budget_bytes={budget} is less than one subgroup's staging "
            f"({object_bytes + grad_bytes} bytes): raise it or lower subgroup_bytes"
        )
    return slots
