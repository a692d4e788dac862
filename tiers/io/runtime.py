"""IORuntime: the machinery every tierkit product shares in one process.

A runtime owns:

* **one engine per event loop.** An engine is bound to the loop that first uses it (io_uring
  is single-issuer), so products on the same loop -- two indexes, a tiered store, an NVMe tier
  -- share one engine and one queue depth: ``acquire_engine()`` on that loop returns the same
  engine, counted; the last ``release_engine`` closes it. Products that are not async (the
  shuffled loader) run on the runtime's own loop thread (``loop``) and share its engine.
* **two executors**: ``blocking`` for calls that wait on the OS (LMDB commits, directory
  fsync, file opens) and ``cpu`` for compute that releases the GIL (scoring, CRCs, decoding),
  sized by the CPU budget ``cpu_threads``. Products run their threads' work here instead of
  making pools of their own.
* **one aligned buffer cache** (``buffers``): page-aligned staging buffers by size class,
  shared by every product's O_DIRECT I/O.
* **counters** (``stats()``): engines opened, leases held, work run on each executor.

Without ``runtime=`` every product uses :func:`default_runtime`, one per process, created on
first use and closed at interpreter exit.

Thread-safety: every public method may be called from any thread; engines themselves are used
only on their own loop. Invariants: at most one open engine per loop; an engine is closed
exactly when its lease count falls to zero or the runtime closes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tiers.io.buffer_cache import BufferCache
from tiers.io.engine import IOEngine
from tiers.io.env import Env
from tiers.io.errors import EngineClosedError, InvalidArgumentError
from tiers.io.factory import create_engine
from tiers.io.loop_thread import LoopThread

__all__ = ["IORuntime", "default_runtime"]

T = TypeVar("T")


class _Lease:
    __slots__ = ("count", "engine")

    def __init__(self, engine: IOEngine) -> None:
        self.engine = engine
        self.count = 0


class IORuntime:
    """Engines, loop thread, executors and buffers shared by the products that take it.

    Args:
        engine: "auto" | "uring" | "thread" | "gds" (see ``create_engine``), or a factory
            ``(queue_depth, env) -> IOEngine``.
        queue_depth: each engine's requests in flight.
        cpu_threads: threads of the ``cpu`` executor (default: the CPUs this process may use).
        blocking_threads: threads of the ``blocking`` executor.
        buffer_cache_bytes: the most idle bytes the buffer cache keeps.
        env: the OS seam the engines use (tests pass a FaultyEnv).
    """

    def __init__(
        self,
        *,
        engine: str | Callable[[int, Env | None], IOEngine] = "auto",
        queue_depth: int = 128,
        cpu_threads: int | None = None,
        blocking_threads: int = 4,
        buffer_cache_bytes: int = 64 << 20,
        env: Env | None = None,
    ) -> None:
        cpu_threads = cpu_threads if cpu_threads is not None else len(os.sched_getaffinity(0))
        for name, value in (("queue_depth", queue_depth), ("cpu_threads", cpu_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(blocking_threads, bool) or not isinstance(blocking_threads, int):
            raise InvalidArgumentError(f"blocking_threads must be an int, got {blocking_threads!r}")
        if blocking_threads < 1:
            raise InvalidArgumentError(f"blocking_threads must be >= 1, got {blocking_threads}")
        self.engine_kind = engine
        self.queue_depth = queue_depth
        self.cpu_threads = cpu_threads
        self.env = env
        self.buffers = BufferCache(max_cached_bytes=buffer_cache_bytes)
        self.blocking = concurrent.futures.ThreadPoolExecutor(
            blocking_threads, thread_name_prefix="tierkit-blocking"
        )
        self.cpu = concurrent.futures.ThreadPoolExecutor(
            cpu_threads, thread_name_prefix="tierkit-cpu"
        )
        self._lock = threading.Lock()
        self._leases: dict[asyncio.AbstractEventLoop, _Lease] = {}
        self._loop_thread: LoopThread | None = None
        self._closed = False
        self._counts = {"engines_opened": 0, "blocking_calls": 0, "cpu_calls": 0}

    # ---------------------------------------------------------------- engines
    def acquire_engine(self) -> IOEngine:
        """The engine of the running loop (made on first use); pair with :meth:`release_engine`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_open()
            lease = self._leases.get(loop)
            if lease is None or lease.engine.closed:
                lease = _Lease(self._make_engine())
                self._leases[loop] = lease
                self._counts["engines_opened"] += 1
            lease.count += 1
            return lease.engine

    async def release_engine(self, engine: IOEngine) -> None:
        """Give back a lease from :meth:`acquire_engine`; the last one closes the engine."""
        loop = asyncio.get_running_loop()
        with self._lock:
            lease = self._leases.get(loop)
            if lease is None or lease.engine is not engine:
                return  # already closed with the runtime, or never leased here
            lease.count -= 1
            if lease.count > 0:
                return
            del self._leases[loop]
        await engine.aclose()

    def _make_engine(self) -> IOEngine:
        if callable(self.engine_kind):
            return self.engine_kind(self.queue_depth, self.env)
        return create_engine(self.engine_kind, self.queue_depth, self.env)

    # ---------------------------------------------------------------- loop thread
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The runtime's own event loop, running in a daemon thread (started on first use)."""
        with self._lock:
            self._check_open()
            if self._loop_thread is None:
                self._loop_thread = LoopThread("tierkit-runtime")
            return self._loop_thread.loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the runtime's loop; a future for its result (any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    # ---------------------------------------------------------------- executors
    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the blocking executor, awaited from the caller's loop."""
        self._counts["blocking_calls"] += 1
        return await asyncio.get_running_loop().run_in_executor(self.blocking, fn, *args)

    async def run_cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the CPU executor (the CPU budget), awaited from the caller's loop."""
        self._counts["cpu_calls"] += 1
        return await asyncio.get_running_loop().run_in_executor(self.cpu, fn, *args)

    # ---------------------------------------------------------------- life cycle
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this IORuntime is closed")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            engines = {lease.engine.name: lease.count for lease in self._leases.values()}
            return {
                **self._counts,
                "engines_open": len(self._leases),
                "leases": sum(lease.count for lease in self._leases.values()),
                "engines": engines,
                "cpu_threads": self.cpu_threads,
                "queue_depth": self.queue_depth,
                "buffer_cache": self.buffers.stats(),
                "loop_thread": self._loop_thread is not None,
            }

    def close(self) -> None:
        """Close every engine still leased, stop the loop thread and the executors.

        Engines on loops other than the runtime's must be released on their loop first (their
        products' ``aclose``); one still open here is closed only if its loop is not running.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leases, self._leases = self._leases, {}
            loop_thread, self._loop_thread = self._loop_thread, None
        for loop, lease in leases.items():
            _close_engine_on(loop, lease.engine, loop_thread)
        if loop_thread is not None:
            loop_thread.stop()
        self.blocking.shutdown(wait=True)
        self.cpu.shutdown(wait=True)
        self.buffers.clear()


def _close_engine_on(
    loop: asyncio.AbstractEventLoop, engine: IOEngine, loop_thread: LoopThread | None
) -> None:
    if loop_thread is not None and loop is loop_thread.loop:
        asyncio.run_coroutine_threadsafe(engine.aclose(), loop).result(timeout=30)
    elif not loop.is_closed() and not loop.is_running():
        loop.run_until_complete(engine.aclose())
    # else: the loop is gone or busy in another thread; the engine's fds close with the process


_default: IORuntime | None = None
_default_lock = threading.Lock()


def default_runtime() -> IORuntime:
    """The process-wide runtime that products use when given no ``runtime=``."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = IORuntime()
            atexit.register(_default.close)
        return _default
