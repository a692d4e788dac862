"""Per-tenant request rate limits: one token bucket per tenant, refilled at its key's ``rps``.

    limiter = RateLimiter()
    wait_s = limiter.acquire("acme", rps=5.0)   # 0.0: go on; > 0: refuse, retry after wait_s

A bucket holds at most ``burst = max(1, rps)`` tokens and starts full; each request takes one.
Buckets idle long enough to be full again are dropped, so memory follows the active tenants.

Thread-safety: none needed; called only from the event loop (no await inside).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """Token buckets by tenant name; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at_s)
        self._swept_at_s = clock()

    def acquire(self, tenant: str, rps: float) -> float:
        """Take one token: 0.0 when granted, else the seconds until one is there."""
        now = self._clock()
        burst = max(1.0, rps)
        tokens, at_s = self._buckets.get(tenant, (burst, now))
        tokens = min(burst, tokens + (now - at_s) * rps)
        if tokens >= 1.0:
            self._buckets[tenant] = (tokens - 1.0, now)
            wait_s = 0.0
        else:
            self._buckets[tenant] = (tokens, now)
            wait_s = (1.0 - tokens) / rps
        if now - self._swept_at_s > 60.0:
            self._sweep(now)
        return wait_s

    def _sweep(self, now: float) -> None:
        """Drop buckets idle for a minute: full again by then at any rps >= 1/60."""
        self._swept_at_s = now
        for tenant in [t for t, (_, at_s) in self._buckets.items() if now - at_s > 60.0]:
            del self._buckets[tenant]
