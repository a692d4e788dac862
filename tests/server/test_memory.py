"""The service's C heap: after ``settle_allocator`` an array of a few MiB is a mapping of its own,
given back when freed (glibc would otherwise serve it from a heap once a bigger block was freed);
an operator's ``MALLOC_MMAP_THRESHOLD_`` is left alone; ``/metrics`` carries the allocator's
bytes."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from server.memory import malloc_bytes, settle_allocator
from server.metrics import Metrics

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not malloc_bytes(), reason="not glibc >= 2.33 (no mallinfo2)")


def test_big_arrays_are_mapped_and_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    # a freed 8 MiB block raises glibc's own threshold to 8 MiB: past this, a 2 MiB array
    # would come from a heap and its pages stay there when freed
    big = np.ones(8 * MIB, np.uint8)
    del big
    assert settle_allocator()
    gc.collect()  # earlier tests' garbage freed now, not inside the window
    before = malloc_bytes()
    array = np.ones(2 * MIB, np.uint8)
    assert malloc_bytes()["mmapped"] >= before["mmapped"] + 2 * MIB
    del array  # freed at once (no cycle)
    after = malloc_bytes()
    assert after["mmapped"] <= before["mmapped"] + MIB // 2  # unmapped, not kept
    assert after["free"] < before["free"] + MIB  # not in a heap either (other threads: slack)


def test_operator_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(4 * MIB))
    assert settle_allocator() is False


def test_metrics_carry_allocator_bytes() -> None:
    body, _ = Metrics(lambda: None).render()
    samples = dict(
        line.split() for line in body.decode().splitlines() if line.startswith("tierkit_malloc")
    )
    assert set(samples) == {f"tierkit_malloc_{n}_bytes" for n in ("in_use", "free", "mmapped")}
    assert float(samples["tierkit_malloc_in_use_bytes"]) > MIB  # this process's own heap
    assert min(float(v) for v in samples.values()) >= 0
