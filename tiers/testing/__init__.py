"""tiers.testing: what tests of tierkit and of third-party engines and tiers use.

Fault injectors (``FaultyEngine``, ``FaultyEnv``) need nothing beyond tierkit. The contract
suites (``EngineContract``, ``TierContract``) need pytest and hypothesis, so they load only
when asked for.
"""

from typing import Any

from tiers.testing.crash_log import CrashLog, PowerCutReport
from tiers.testing.faulty_engine import FAULT_KINDS, FaultyEngine
from tiers.testing.faulty_env import ENV_FAULT_KINDS, FaultyEnv

__all__ = [
    "ENV_FAULT_KINDS",
    "FAULT_KINDS",
    "CrashLog",
    "EngineContract",
    "FaultyEngine",
    "FaultyEnv",
    "PowerCutReport",
    "TierContract",
]


def __getattr__(name: str) -> Any:
    if name == "EngineContract":
        from tiers.testing.engine_contract import EngineContract

        return EngineContract
    if name == "TierContract":
        from tiers.testing.tier_contract import TierContract

        return TierContract
    raise AttributeError(f"module 'tiers.testing' has no attribute {name!r}")
