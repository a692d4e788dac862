"""The service's C heap: after ``settle_allocator`` an array of a few MiB is a mapping of its own,
given back when freed (glibc would otherwise serve it from a heap once a bigger block was freed);
an operator's ``MALLOC_MMAP_THRESHOLD_`` is left alone; ``/metrics`` carries the allocator's
bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from server.memory import malloc_bytes, settle_allocator
from server.metrics import Metrics

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not malloc_bytes(), reason="not glibc >= 2.33 (no mallinfo2)")


_MAPPED_AND_GIVEN_BACK = """
import gc, json
import numpy as np
from server.memory import malloc_bytes, settle_allocator

MIB = 1 << 20
big = np.ones(8 * MIB, np.uint8)  # freed, it raises glibc's own threshold to 8 MiB
del big
settled = settle_allocator()
gc.collect()
before = malloc_bytes()
array = np.ones(2 * MIB, np.uint8)
during = malloc_bytes()
del array  # freed at once (no cycle)
after = malloc_bytes()
print(json.dumps({"settled": settled, "before": before, "during": during, "after": after}))
"""


def test_big_arrays_are_mapped_and_given_back() -> None:
    """In a fresh process, as the service starts: a free block already in a heap would serve a
    2 MiB request whatever the threshold (the threshold only decides how a heap grows), so the
    check runs where earlier tests left nothing behind."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, "-c", _MAPPED_AND_GIVEN_BACK],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    report = json.loads(out.strip().splitlines()[-1])
    before, during, after = report["before"], report["during"], report["after"]
    assert report["settled"]
    assert during["mmapped"] >= before["mmapped"] + 2 * MIB  # a mapping of its own
    assert after["mmapped"] <= before["mmapped"] + MIB // 2  # unmapped, not kept
    assert after["free"] < before["free"] + MIB  # not in a heap either


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
