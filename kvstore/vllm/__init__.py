"""kvstore.vllm: vLLM plug-ins over the tierkit KV block store (need vLLM 0.32+, not a
tierkit dependency: import a submodule only where vLLM is installed).

TierkitConnector      a ``KVConnectorBase_V1`` (``kv_connector_module_path="kvstore.vllm"``):
                      vLLM's paged KV cache saved to and loaded from a KVBlockStore
TierkitOffloadingSpec an ``OffloadingSpec`` for vLLM's OffloadingConnector (CPU-side manager
                      and worker over a KVBlockStore)
TierkitSecondaryTier  a ``SecondaryTierManager`` behind vLLM's CPU offload tier

Names resolve lazily so that ``import kvstore.vllm`` works without vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TierkitConnector", "TierkitOffloadingSpec", "TierkitSecondaryTier"]

_WHERE = {
    "TierkitConnector": "kvstore.vllm.connector",
    "TierkitOffloadingSpec": "kvstore.vllm.offloading",
    "TierkitSecondaryTier": "kvstore.vllm.secondary_tier",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'kvstore.vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
