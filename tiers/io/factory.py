"""create_engine: pick the best I/O engine this machine can run, and say why in one log line.

Order for ``kind="auto"``: io_uring, else the thread pool. GPUDirect Storage is never picked
implicitly (it needs CUDA tensors as buffers); ask for ``kind="gds"``. The environment variable
``TIERKIT_IO_ENGINE`` (auto | uring | thread | gds) overrides the default kind.
"""

from __future__ import annotations

import logging
import os

from tiers.io.engine import IOEngine
from tiers.io.env import Env
from tiers.io.errors import EngineUnavailableError, InvalidArgumentError

__all__ = ["ENGINE_KINDS", "create_engine"]

ENGINE_KINDS = ("auto", "uring", "thread", "gds")
log = logging.getLogger("tierkit.tiers")


def create_engine(
    kind: str | None = None, queue_depth: int = 128, env: Env | None = None
) -> IOEngine:
    """An engine of ``kind``; "auto" falls back from io_uring to threads with one log line.

    Raises:
        InvalidArgumentError: unknown kind.
        EngineUnavailableError: an explicitly requested kind cannot run here.
    """
    kind = (kind or os.environ.get("TIERKIT_IO_ENGINE") or "auto").lower()
    if kind not in ENGINE_KINDS:
        raise InvalidArgumentError(f"unknown engine kind {kind!r}; choose from {ENGINE_KINDS}")
    from tiers.io.threaded import ThreadEngine
    from tiers.io.uring.engine import UringEngine

    if kind == "thread":
        return ThreadEngine(queue_depth, env)
    if kind == "gds":
        from tiers.io.gds import GdsEngine

        return GdsEngine(queue_depth, env)
    reason = UringEngine.probe(env)
    if reason is None:
        return UringEngine(queue_depth, env)
    if kind == "uring":
        raise EngineUnavailableError("io_uring", reason)
    log.warning("tierkit: io_uring unavailable (%s); using the thread-pool engine", reason)
    return ThreadEngine(queue_depth, env)
