"""ExtentAllocator against a plain model of allocated intervals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io.errors import InvalidArgumentError
from tiers.storage.extents import ExtentAllocator


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20_000)), max_size=120))
def test_never_overlaps_and_reuses_every_byte(ops: list[tuple[bool, int]]) -> None:
    allocator = ExtentAllocator(256 * 1024, 4096)
    live: dict[int, int] = {}
    for allocate, size in ops:
        if allocate or not live:
            start = allocator.allocate(size)
            if start is None:
                assert allocator.largest_free() < allocator.rounded(size)
                continue
            assert start % 4096 == 0 and start + allocator.rounded(size) <= 256 * 1024
            for other, other_size in live.items():
                assert (
                    start + allocator.rounded(size) <= other
                    or other + allocator.rounded(other_size) <= start
                )
            live[start] = size
        else:
            start = next(iter(live))
            allocator.free(start, live.pop(start))
        used = sum(allocator.rounded(s) for s in live.values())
        assert allocator.free_bytes == 256 * 1024 - used
    for start, size in list(live.items()):
        allocator.free(start, size)
    assert allocator.largest_free() == 256 * 1024  # everything merged back into one hole


def test_double_free_and_foreign_free_are_refused() -> None:
    allocator = ExtentAllocator(64 * 1024, 4096)
    start = allocator.allocate(5000)
    assert start == 0
    allocator.free(start, 5000)
    with pytest.raises(InvalidArgumentError):
        allocator.free(start, 5000)
    with pytest.raises(InvalidArgumentError):
        allocator.free(100, 10)


def test_best_class_first_keeps_big_holes() -> None:
    allocator = ExtentAllocator(1 << 20, 4096)
    a, b, c = (allocator.allocate(4096) for _ in range(3))
    assert (a, b, c) == (0, 4096, 8192)
    allocator.free(b, 4096)  # a one-page hole between two live extents
    assert allocator.allocate(4096) == b  # the small hole serves the small request


def test_an_arena_can_start_empty_and_grow_by_frees() -> None:
    allocator = ExtentAllocator(1 << 40, 4096, all_free=False)
    assert allocator.free_bytes == 0 and allocator.allocate(4096) is None
    allocator.free(0, 8192)  # the first part of the backing exists
    assert allocator.allocate(4096) == 0
    assert allocator.free_bytes_before(8192) == 4096  # the free tail a grower can extend
    allocator.free(8192, 8192)  # more backing: merges with that tail
    assert allocator.free_bytes_before(16384) == 12288 and allocator.free_bytes_before(8192) == 0
    assert allocator.allocate(12288) == 4096
    assert allocator.free_bytes == 0 and allocator.free_bytes_before(16384) == 0
