"""kvstore: LLM KV-cache blocks on the tiered store, bounded, checksummed and restart-safe.

KVBlockStore      blocks by hash, namespaced by a ModelFingerprint: lookup (longest cached
                  prefix), load into caller tensors, store, pin/unpin, evict
SyncKVBlockStore  the same for threads (vLLM's connector hooks)
ModelFingerprint  what makes two models' blocks interchangeable; chain_hashes: stable
                  sha256 block hashes of token ids
BLOCK_POLICIES    eviction: "lru", "cost", "prefix" (leaves of the prefix tree first),
                  "prefix-admit" ("prefix" behind a learned admission filter)
"""

from kvstore.block_store import KVBlockStore
from kvstore.fingerprint import ModelFingerprint, chain_hashes
from kvstore.kivi import KiviCodec
from kvstore.policies import BLOCK_POLICIES, recompute_cost
from kvstore.sync_store import SyncKVBlockStore

__all__ = [
    "BLOCK_POLICIES",
    "KVBlockStore",
    "KiviCodec",
    "ModelFingerprint",
    "SyncKVBlockStore",
    "chain_hashes",
    "recompute_cost",
]
