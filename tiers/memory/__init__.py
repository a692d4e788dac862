"""tiers.memory: the memory tiers (HBM, DRAM, CXL), each one preallocated arena, and NUMA."""

from tiers.memory.arena import ArenaTier
from tiers.memory.cxl import CxlTier
from tiers.memory.dram import DramTier
from tiers.memory.hbm import HbmTier
from tiers.memory.host_arena import HostArenaTier
from tiers.memory.numa import NumaNode, bind_to_node, cpuless_nodes, numa_nodes, pages_on_node

__all__ = [
    "ArenaTier",
    "CxlTier",
    "DramTier",
    "HbmTier",
    "HostArenaTier",
    "NumaNode",
    "bind_to_node",
    "cpuless_nodes",
    "numa_nodes",
    "pages_on_node",
]
