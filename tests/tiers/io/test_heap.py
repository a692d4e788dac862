"""trim_heap and cap_heap_retention: freed memory goes back to the OS (RSS falls), where the C
library is glibc; elsewhere both say they could not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tiers.io import cap_heap_retention, trim_heap

_SCRIPT = """
import numpy as np, threading
from tiers.io import cap_heap_retention, trim_heap

def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

CAP = {cap}
if CAP:
    assert cap_heap_retention()

def churn():
    # big blocks, freed: glibc raises its mmap threshold to them, then keeps the next ones
    for size in (8, 16, 24, 32):
        block = np.ones(size << 20, np.uint8)
        del block
    keep = [np.ones(2 << 20, np.uint8) for _ in range(40)]
    del keep

before = rss_mib()
worker = threading.Thread(target=churn)
worker.start(); worker.join()
held = rss_mib() - before
trim_heap()
print(round(held), round(rss_mib() - before))
"""


def _run(cap: bool) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(cap=cap)], capture_output=True, text=True, check=True
    )
    held, after_trim = (int(v) for v in done.stdout.split())
    return held, after_trim


@pytest.mark.skipif(not trim_heap(), reason="the C library is not glibc")
def test_capped_retention_gives_big_blocks_back_as_they_are_freed() -> None:
    held, after_trim = _run(cap=True)
    assert held <= 8 and after_trim <= 8  # 80 MiB allocated and freed


@pytest.mark.skipif(not trim_heap(), reason="the C library is not glibc")
def test_trimming_gives_back_what_the_heaps_kept() -> None:
    held, after_trim = _run(cap=False)
    assert after_trim <= max(8, held // 4)


def test_trim_answers_a_bool_and_the_cap_is_only_set_in_a_child() -> None:
    assert isinstance(trim_heap(), bool)  # the cap is process-wide: never set in the test run
    assert callable(cap_heap_retention)
