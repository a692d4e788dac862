"""The CPU-thread budget of compute libraries, shared by every product in the process.

numpy's BLAS is held to one thread while any search (or other caller of
``single_threaded_blas``) runs -- process-wide, counted -- and torch's OpenMP is held to the
calling thread for a block (per thread: ``this_thread_openmp_alone``). The IORuntime's CPU
executor (``cpu_threads`` threads) is then the one place compute parallelism comes from.

Why: a search does many small matrix products on two threads of its own (the loop thread and
the scoring thread, search.py). OpenBLAS, given more threads, wakes its workers for the larger
of those products and leaves them spinning for a while afterwards; on a small machine they take
the cores our own threads need (measured on 2 vCPUs: ~210 ms of CPU per 500-query batch with
numpy's default of 2 BLAS threads, ~120 ms with 1, same wall time or better). The search
splits its one large product (the head scan) over its two threads itself.

Only the BLAS library numpy itself loaded is touched (found with threadpoolctl by its path
under numpy's directory), never another library's (faiss ships its own). The first search to
start saves numpy's setting and sets 1; the last to finish restores it; searches overlapping
in time (on one loop or several) share the one setting. Where numpy's BLAS cannot be found or
controlled, this does nothing.

Thread-safety: safe from any thread (one lock).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["single_threaded_blas", "this_thread_openmp_alone", "torch_openmp"]

_lock = threading.Lock()
_active = 0
_saved: list[tuple[Any, int]] = []


def _controllers(user_api: str, directories: tuple[str, ...]) -> tuple[Any, ...]:
    """threadpoolctl controllers of the ``user_api`` libraries loaded from ``directories``."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    try:
        controllers = ThreadpoolController().lib_controllers
    except Exception:  # an odd build: do without
        return ()
    return tuple(
        c for c in controllers if c.user_api == user_api and str(c.filepath).startswith(directories)
    )


@functools.cache
def _numpy_blas() -> tuple[Any, ...]:
    """The BLAS libraries under numpy's own directory."""
    numpy_dir = os.path.dirname(os.path.dirname(np.__file__))  # site-packages
    return _controllers(
        "blas", (os.path.join(numpy_dir, "numpy"), os.path.join(numpy_dir, "numpy.libs"))
    )


@functools.cache
def torch_openmp() -> tuple[Any, ...]:
    """The OpenMP runtime torch loaded from its own directory (empty without torch)."""
    import torch

    return _controllers("openmp", (os.path.dirname(torch.__file__),))


@contextmanager
def this_thread_openmp_alone() -> Iterator[None]:
    """The calling thread's torch OpenMP regions run on one thread for the block. OpenMP's
    thread count is a per-thread setting: other threads, and torch's default for threads yet
    to start, are untouched (unlike ``torch.set_num_threads``). Used by head_scan: a search
    runs products on two threads of its own, and a second OpenMP worker would wait for the
    core the other one holds."""
    import torch

    controllers = torch_openmp()
    torch.get_num_threads()  # torch sets a thread's OpenMP threads on first use: do it first
    saved = [c.num_threads for c in controllers]
    for c in controllers:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, threads in zip(controllers, saved, strict=True):
            c.set_num_threads(threads)


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    global _active
    with _lock:
        if _active == 0:
            for controller in _numpy_blas():
                _saved.append((controller, controller.num_threads))
                controller.set_num_threads(1)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                for controller, threads in _saved:
                    controller.set_num_threads(threads)
                _saved.clear()
