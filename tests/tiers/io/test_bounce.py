"""BounceBuffers: aligned, close-fitting size classes, reuse, and a bounded cache."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tiers.io.bounce import BounceBuffers


@given(st.integers(0, 64 << 20))
def test_classes_fit_closely_and_stay_aligned(size: int) -> None:
    buffers = BounceBuffers(max_buffer_bytes=16 << 20)
    cls = buffers.class_bytes(size)
    assert cls >= max(size, 1) and cls % 4096 == 0
    rounded = max(4096, -(-size // 4096) * 4096)
    assert cls <= rounded * 1.125  # at most 1/8 above the page-rounded size


def test_buffers_are_reused_and_the_cache_is_bounded() -> None:
    buffers = BounceBuffers(max_cached_bytes=64 * 1024, max_buffer_bytes=32 * 1024)
    first = buffers.take(5000)
    assert first.nbytes == 8192 and first.__array_interface__["data"][0] % 4096 == 0
    buffers.give(first)
    assert buffers.take(6000) is first and buffers.hits == 1  # same class: reused
    big = buffers.take(100_000)  # above max_buffer_bytes: made to measure, never kept
    assert big.nbytes == 102_400
    buffers.give(big)
    assert buffers.cached_bytes == 0
    many = [buffers.take(32 * 1024) for _ in range(4)]
    for buffer in many:
        buffers.give(buffer)
    assert buffers.cached_bytes == 64 * 1024  # two of the four fit the cache; the rest dropped
