"""Subgroups: the fixed-size flat fp32 ranges an OffloadedOptimizer streams, and its error.

The parameters of each param group, in order, are laid end to end as one flat fp32 range and
cut into subgroups of at most ``subgroup_numel`` elements; a subgroup never spans two groups
(each group has its own hyperparameters). A parameter may span subgroups: every supported
optimizer is elementwise, so stepping a parameter's pieces gives the same bits as stepping it
whole (tests/kvstore/optim/test_exact.py checks it per optimizer and subgroup size). The
exception is torch's fused CPU kernels, which round a few elements differently depending on
where a tensor ends (seen: 1 element of 1000 after 20 AdamW steps); with ``split_params=False``
(used for ``fused=True``) a subgroup holds whole parameters, and one larger than
``subgroup_numel`` gets a subgroup of its own.

A subgroup is stored as one object: ``1 + len(vector_keys)`` sections (the master weights, then
each per-element state) of ``stride`` elements each, ``stride`` rounded up to 1024 elements so
that every section and the object are whole 4 KiB pages (NVMe reads them straight into the
aligned staging buffers).

Invariants: segments of a subgroup are contiguous and in order (``offset`` increases by
``length``); the segments of one parameter cover it exactly once, in order.
Thread-safety: immutable after ``build_layout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiers import TierkitError

__all__ = ["PAGE_ELEMS", "OffloadError", "Segment", "Subgroup", "build_layout", "param_segments"]

PAGE_ELEMS = 1024  # fp32 elements per 4 KiB page


class OffloadError(TierkitError):
    """An OffloadedOptimizer cannot do what was asked: an unsupported optimizer, parameters it
    cannot hold, a stored state that does not match the parameters, a use after close."""


@dataclass(frozen=True)
class Segment:
    """Elements ``[start, start + length)`` of flattened parameter ``param_index`` (its index
    in torch's state_dict numbering) at ``offset`` in its subgroup."""

    param_index: int
    start: int
    length: int
    offset: int


@dataclass(frozen=True)
class Subgroup:
    index: int
    group_index: int
    segments: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        return sum(s.length for s in self.segments)

    @property
    def stride(self) -> int:
        """Elements per section of the stored object: ``numel`` rounded up to whole pages."""
        return -(-self.numel // PAGE_ELEMS) * PAGE_ELEMS

    def object_bytes(self, sections: int) -> int:
        return sections * self.stride * 4


def build_layout(
    group_numels: Sequence[Sequence[int]], subgroup_numel: int, *, split_params: bool = True
) -> list[Subgroup]:
    """Cut the parameters (``group_numels[g]``: element counts of group g's params, in order,
    numbered across groups as torch's state_dict numbers them) into subgroups."""
    if subgroup_numel < 1:
        raise OffloadError(f"subgroup_numel must be >= 1, got {subgroup_numel}")
    subgroups: list[Subgroup] = []
    param_index = 0
    for group_index, numels in enumerate(group_numels):
        current: list[Segment] = []
        filled = 0

        def close(group_index: int = group_index) -> None:
            nonlocal current, filled
            if current:
                subgroups.append(Subgroup(len(subgroups), group_index, tuple(current)))
            current, filled = [], 0

        for numel in numels:
            if numel == 0:  # nothing to step or store; torch's state for it stays empty
                param_index += 1
                continue
            if not split_params:
                if filled and filled + numel > subgroup_numel:
                    close()
                current.append(Segment(param_index, 0, numel, filled))
                filled += numel
                if filled >= subgroup_numel:
                    close()
            else:
                start = 0
                while start < numel:
                    take = min(numel - start, subgroup_numel - filled)
                    current.append(Segment(param_index, start, take, filled))
                    start += take
                    filled += take
                    if filled == subgroup_numel:
                        close()
            param_index += 1
        close()
    return subgroups


def param_segments(subgroups: Sequence[Subgroup]) -> dict[int, list[tuple[Subgroup, Segment]]]:
    """For each parameter index, its (subgroup, segment) pieces in order."""
    pieces: dict[int, list[tuple[Subgroup, Segment]]] = {}
    for subgroup in subgroups:
        for segment in subgroup.segments:
            pieces.setdefault(segment.param_index, []).append((subgroup, segment))
    return pieces
