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


_TRIMMED = """
import asyncio, ctypes, json
from server.memory import trimming_heap

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])


async def main(every_s):
    blocks = [libc.malloc(64 << 10) for _ in range(512)]  # 32 MiB of the main heap
    for block in blocks:
        libc.memset(block, 1, 64 << 10)
    keep = libc.malloc(64 << 10)  # a live block above them: the heap's top is not free
    for block in blocks:
        libc.free(block)
    freed = anon_kib()
    async with trimming_heap(every_s):
        await asyncio.sleep(0.5)
    print(json.dumps({"freed_kib": freed, "after_kib": anon_kib()}))
    libc.free(keep)

asyncio.run(main(float(__import__("sys").argv[1])))
"""


@pytest.mark.parametrize("every_s", [0.1, 0.0])
def test_trimming_gives_freed_heap_pages_back(every_s: float) -> None:
    """32 MiB freed in the middle of the main heap stay resident until trimmed: with the
    trimmer on (every 0.1 s) they go back within half a second; off (0), they stay."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, "-c", _TRIMMED, str(every_s)],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    report = json.loads(out.strip().splitlines()[-1])
    given_back_kib = report["freed_kib"] - report["after_kib"]
    if every_s:
        assert given_back_kib > 24 * 1024, report
    else:
        assert given_back_kib < 8 * 1024, report
