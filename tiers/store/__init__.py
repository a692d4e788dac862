"""tiers.store: the tiered store over an ordered list of tiers, its policies and its config."""

from tiers.store.config import load_config, open_store, parse_size
from tiers.store.policy import POLICIES, CostAwarePolicy, EvictionPolicy, LfuPolicy, LruPolicy
from tiers.store.stats import TierCounters
from tiers.store.tiered_store import TieredStore

__all__ = [
    "POLICIES",
    "CostAwarePolicy",
    "EvictionPolicy",
    "LfuPolicy",
    "LruPolicy",
    "TierCounters",
    "TieredStore",
    "load_config",
    "open_store",
    "parse_size",
]
