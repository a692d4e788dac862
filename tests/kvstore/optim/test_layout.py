"""build_layout: every parameter covered once, in order, by fixed-size subgroups."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.optim.layout import PAGE_ELEMS, build_layout, param_segments

GROUPS = st.lists(st.lists(st.integers(0, 300), max_size=6), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(GROUPS, st.integers(1, 257), st.booleans())
def test_subgroups_cover_each_parameter_once_in_order(
    numels: list[list[int]], subgroup_numel: int, split: bool
) -> None:
    subgroups = build_layout(numels, subgroup_numel, split_params=split)
    flat = [(g, n) for g, group in enumerate(numels) for n in group]
    pieces = param_segments(subgroups)
    for index, (group, numel) in enumerate(flat):
        covered = 0
        for subgroup, segment in pieces.get(index, []):
            assert subgroup.group_index == group  # a subgroup never spans groups
            assert segment.start == covered  # in order, no gap, no overlap
            covered += segment.length
            if not split:
                assert segment.start == 0 and segment.length == numel  # whole parameters
        assert covered == numel
    for position, subgroup in enumerate(subgroups):
        assert subgroup.index == position
        offset = 0
        for segment in subgroup.segments:
            assert segment.offset == offset and segment.length > 0
            offset += segment.length
        if split or len(subgroup.segments) > 1:
            assert subgroup.numel <= subgroup_numel
        assert subgroup.stride % PAGE_ELEMS == 0 and subgroup.stride >= subgroup.numel
    if split:  # fixed size: only a group's last subgroup may be short
        for before, after in itertools.pairwise(subgroups):
            if before.group_index == after.group_index:
                assert before.numel == subgroup_numel
