"""kvstore.optim: optimizer-state offload. ``OffloadedOptimizer`` wraps an elementwise torch
optimizer and keeps its fp32 master weights and states in a tier (DRAM or NVMe), streamed
subgroup by subgroup through a few staging buffers; ``OffloadError`` is what it refuses with.
"""

from kvstore.optim.layout import OffloadError
from kvstore.optim.offloaded import OffloadedOptimizer

__all__ = ["OffloadError", "OffloadedOptimizer"]
