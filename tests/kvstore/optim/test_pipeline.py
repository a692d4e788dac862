"""stream overlaps reads ahead / step i / writes behind without ever touching a slot that has
I/O in flight; Staging's host memory depends on the subgroup size, not on the model's."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch

from kvstore.optim import OffloadedOptimizer
from kvstore.optim.pipeline import depth, stream


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 5, 6])
def test_no_slot_is_used_while_its_io_is_in_flight(slots: int) -> None:
    busy: dict[int, str] = {}  # slot -> the I/O in flight on it
    lock = threading.Lock()
    log: list[str] = []
    pool = concurrent.futures.ThreadPoolExecutor(4)

    def io(kind: str, items: list[int], slots: list[int]) -> concurrent.futures.Future[object]:
        with lock:
            for item, slot in zip(items, slots, strict=True):
                assert slot not in busy, f"{kind} {item} on slot {slot} while {busy[slot]}"
                busy[slot] = f"{kind} {item}"
                log.append(f"{kind}{item}")

        def run() -> None:
            time.sleep(0.002)
            with lock:
                for slot in slots:
                    del busy[slot]

        return pool.submit(run)

    def compute(item: int, slot: int) -> None:
        with lock:
            assert slot not in busy, f"step {item} on slot {slot} while {busy[slot]}"
            log.append(f"step{item}")

    def write(batch: list[tuple[int, int]]) -> concurrent.futures.Future[object]:
        return io("write", [i for i, _ in batch], [s for _, s in batch])

    stream(list(range(11)), slots, lambda i, s: io("read", [i], [s]), compute, write)
    assert not busy
    assert [e for e in log if e.startswith("step")] == [f"step{i}" for i in range(11)]
    assert sorted(e for e in log if e.startswith("write")) == sorted(f"write{i}" for i in range(11))
    ahead, batch = depth(slots)
    if slots > 1:  # the next reads are issued before the step
        assert log.index(f"read{ahead}") < log.index("step0")
    if batch > 1:  # written together
        assert log.index("write0") + 1 == log.index("write1")


def test_a_failing_step_waits_for_the_io_it_started() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(2)
    started: list[concurrent.futures.Future[object]] = []

    def read(item: int, slot: int) -> concurrent.futures.Future[object]:
        started.append(pool.submit(time.sleep, 0.05))
        return started[-1]

    def compute(item: int, slot: int) -> None:
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        stream([0, 1, 2], 3, read, compute, lambda batch: None)
    assert all(f.done() for f in started)  # no buffer is given back with a read landing


def test_host_memory_depends_on_the_subgroup_not_the_model() -> None:
    sizes = {}
    for numel in (20_000, 400_000):
        params = [torch.nn.Parameter(torch.zeros(numel))]
        with OffloadedOptimizer(
            params, torch.optim.AdamW, subgroup_bytes=4 * 4096, resident=False
        ) as opt:
            sizes[numel] = opt.staging.host_bytes
            assert len(opt.staging.slots) == 4
    assert sizes[20_000] == sizes[400_000] == 4 * 4096 * (4 * 3 + 1)
    params = [torch.nn.Parameter(torch.zeros(100_000))]
    budget = 4 * 4096 * (3 + 1)  # one object (master + 2 moments) and the gradients
    with OffloadedOptimizer(
        params, subgroup_bytes=4 * 4096, host_budget_bytes=budget, resident=False
    ) as opt:
        assert len(opt.staging.slots) == 1 and opt.staging.host_bytes == budget
        params[0].grad = torch.ones_like(params[0])
        opt.step()  # one slot: read, step, write in turn
        assert opt.committed_step == 1
