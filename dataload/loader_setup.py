"""The loader's set-up helpers: runtime, distributed defaults, pinning, worker context, close.

Concurrency: pure functions, except ``close_fetcher`` (run once, by the loader's finalizer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataload.fetcher import Fetcher
from dataload.workers.fetcher import ProcessFetcher
from tiers.io import InvalidArgumentError, IOEngine, IORuntime

__all__ = [
    "close_fetcher",
    "cuda_available",
    "distributed_defaults",
    "mp_context",
    "pin",
    "pin_note",
    "private_runtime",
]


def private_runtime(
    runtime: IORuntime | None, engine: str | Callable[[], IOEngine] | None, queue_depth: int
) -> IORuntime | None:
    """A runtime of the loader's own when it asks for an engine or depth of its own."""
    if (engine is None or engine == "auto") and queue_depth == 128:
        return None
    if runtime is not None:
        raise InvalidArgumentError("pass runtime= or engine=/queue_depth=, not both")
    if callable(engine):
        factory = engine
        return IORuntime(engine=lambda *_: factory(), queue_depth=queue_depth)
    return IORuntime(engine=engine or "auto", queue_depth=queue_depth)


def close_fetcher(fetcher: Fetcher | ProcessFetcher, owned_runtime: IORuntime | None) -> None:
    fetcher.close()
    if owned_runtime is not None:
        owned_runtime.close()


def mp_context(context: Any) -> Any:
    """A multiprocessing context from DataLoader's ``multiprocessing_context`` forms."""
    if context is None or context == "forkserver":
        return None  # the pool's own: forkserver with torch preloaded
    if isinstance(context, str):
        if context == "fork":
            raise InvalidArgumentError(
                "fork is unsafe here: the loader's process runs an I/O thread and io_uring"
            )
        import multiprocessing

        return multiprocessing.get_context(context)
    return context


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank), (
            dist.get_world_size() if world_size is None else world_size
        )
    return rank or 0, world_size or 1


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pin_note(asked: bool, active: bool) -> str:
    if not asked:
        return "off"
    return "on" if active else "ignored: no CUDA device (pinning only helps host-to-GPU copies)"


def pin(value: Any) -> Any:
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(value)
