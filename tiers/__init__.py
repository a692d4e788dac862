"""tiers: the async I/O core and the tiered store every tierkit product is built on."""

from tiers.batch import IOBatch, Op, ReadRequest, WriteRequest
from tiers.buffers import PAGE_SIZE_BYTES, BufferRef, aligned_empty, as_buffer
from tiers.config import ConfigError, load_config, open_store
from tiers.cxl import CxlTier
from tiers.dram import DramTier
from tiers.engine import FileHandle, IOEngine
from tiers.env import Env, default_env
from tiers.errors import (
    AlignmentError,
    CapacityError,
    CorruptionError,
    DirectIOUnsupportedError,
    EngineClosedError,
    EngineUnavailableError,
    FileMissingError,
    InvalidArgumentError,
    NoMemoryError,
    NoSpaceError,
    PermissionDeniedError,
    StorageError,
    TierkitError,
    UnexpectedEOFError,
)
from tiers.factory import ENGINE_KINDS, create_engine
from tiers.faulty import FaultyEngine, PowerCutReport
from tiers.faulty_env import FaultyEnv
from tiers.gds import GdsEngine
from tiers.hbm import HbmTier
from tiers.host_arena import HostArenaTier
from tiers.memory_tier import ArenaTier
from tiers.numa import NumaNode, bind_to_node, cpuless_nodes, numa_nodes, pages_on_node
from tiers.nvme import NvmeTier
from tiers.pool import AlignedBufferPool, PooledBuffer
from tiers.store import TieredStore
from tiers.threaded import ThreadEngine
from tiers.tier import Tier
from tiers.uring import UringEngine

__all__ = [
    "ENGINE_KINDS",
    "PAGE_SIZE_BYTES",
    "AlignedBufferPool",
    "AlignmentError",
    "ArenaTier",
    "BufferRef",
    "CapacityError",
    "ConfigError",
    "CorruptionError",
    "CxlTier",
    "DirectIOUnsupportedError",
    "DramTier",
    "EngineClosedError",
    "EngineUnavailableError",
    "Env",
    "FaultyEngine",
    "FaultyEnv",
    "FileHandle",
    "FileMissingError",
    "GdsEngine",
    "HbmTier",
    "HostArenaTier",
    "IOBatch",
    "IOEngine",
    "InvalidArgumentError",
    "NoMemoryError",
    "NoSpaceError",
    "NumaNode",
    "NvmeTier",
    "Op",
    "PermissionDeniedError",
    "PooledBuffer",
    "PowerCutReport",
    "ReadRequest",
    "StorageError",
    "ThreadEngine",
    "Tier",
    "TieredStore",
    "TierkitError",
    "UnexpectedEOFError",
    "UringEngine",
    "WriteRequest",
    "aligned_empty",
    "as_buffer",
    "bind_to_node",
    "cpuless_nodes",
    "create_engine",
    "default_env",
    "load_config",
    "numa_nodes",
    "open_store",
    "pages_on_node",
]
