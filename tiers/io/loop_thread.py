"""LoopThread: an asyncio event loop running forever in a daemon thread.

The runtime's loop for products whose callers are not async (the shuffled loader's training
loop) and for work that must run on one loop whoever calls it. ``stop`` cancels the tasks
still on the loop, lets them finish their cleanup, closes the loop and joins the thread.

Thread-safety: ``loop`` may be used from any thread through ``call_soon_threadsafe`` and
``run_coroutine_threadsafe``; ``stop`` from any thread but the loop's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

__all__ = ["LoopThread"]


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.result()

    def _run(self, started: concurrent.futures.Future[None]) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set_result, None)
        self.loop.run_forever()
        try:
            self.loop.run_until_complete(self._cancel_remaining())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def _cancel_remaining(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
