"""ThreadEngine: the reference engine passes the same contract."""

from __future__ import annotations

from tiers.engine import IOEngine
from tiers.testing import EngineContract
from tiers.threaded import ThreadEngine


class TestThreadContract(EngineContract):
    def make_engine(self, queue_depth: int = 32) -> IOEngine:
        return ThreadEngine(queue_depth)
