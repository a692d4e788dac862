"""Process workers leave nothing behind: no process, semaphore or /dev/shm segment, even after
1,000 start/stop cycles, a killed worker, or a loader dropped without close()."""

from __future__ import annotations

import gc
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from dataload import FixedSizeSource, ShuffledLoader
from dataload.workers import WorkerDiedError, remove_orphans, shm_names
from dataload.workers.shm import PREFIX, SHM_DIR
from tests.dataload import _work
from tests.dataload.conftest import STAMP_BYTES

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def descendants() -> set[int]:
    """Live or zombie processes below this one (workers are the forkserver's children)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def semaphores() -> list[str]:
    """Named POSIX semaphores this process has mapped (/dev/shm is shared with the machine,
    so its listing alone would count other programs' semaphores)."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/dev/shm/sem." in line})


def leftovers() -> tuple[set[int], list[str], list[str]]:
    gc.collect()
    return descendants(), shm_names(os.getpid()), semaphores()


def one_cycle(path, seed: int) -> None:
    """Start a loader with a worker process, start reading, stop. Every 10th cycle waits for a
    batch (bytes in shared memory, a result slab); the others stop with reads and tasks in
    flight and the worker possibly still starting -- the paths a fast stop takes."""
    source = FixedSizeSource(path, STAMP_BYTES)
    loader = ShuffledLoader(source, 4, seed=seed, transform=_work.stamp_id, num_workers=1)
    try:
        if seed % 10 == 0:
            assert len(next(iter(loader))) == 4
        else:
            loader._fill()  # what iter() starts: prefetch submitted, nothing awaited
    finally:
        loader.close()


@pytest.mark.slow
def test_a_thousand_start_stop_cycles_leak_nothing(stamped) -> None:
    path = stamped(64)
    one_cycle(path, 0)  # starts the forkserver and resource tracker: they live on, shared
    before = leftovers()
    with ThreadPoolExecutor(8) as pool:  # eight loaders at a time: a cycle is mostly waiting
        list(pool.map(lambda seed: one_cycle(path, seed), range(1, 1001)))
    assert leftovers() == before


def test_a_killed_worker_and_a_dropped_loader_leak_nothing(stamped) -> None:
    path = stamped(64)
    one_cycle(path, 0)
    before = leftovers()
    loader = ShuffledLoader(
        FixedSizeSource(path, STAMP_BYTES), 4, transform=_work.slow_stamp_id, num_workers=2
    )
    iterator = iter(loader)
    next(iterator)
    assert shm_names(os.getpid())  # the batches are in shared memory
    os.kill(loader._fetcher.pool.pids[0], signal.SIGKILL)
    died = False
    try:
        list(iterator)
    except WorkerDiedError:  # handled here, so its traceback does not keep the loader alive
        died = True
    assert died
    del iterator, loader  # never closed: the finalizer stops the other worker
    assert leftovers() == before


def test_segments_of_a_dead_loader_process_are_removed() -> None:
    dead = f"{PREFIX}{2**22 + 12345}-0-0"  # above any pid this kernel hands out by default
    with open(os.path.join(SHM_DIR, dead), "wb") as file:
        file.write(b"x")
    mine = f"{PREFIX}{os.getpid()}-999-0"
    with open(os.path.join(SHM_DIR, mine), "wb") as file:
        file.write(b"x")
    try:
        assert remove_orphans() >= 1
        assert dead not in shm_names() and mine in shm_names()
    finally:
        for name in (dead, mine):
            if name in shm_names():
                os.unlink(os.path.join(SHM_DIR, name))
