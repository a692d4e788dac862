"""tiers: the async I/O core and the tiered store every tierkit product is built on.

Layers, each a subpackage whose ``__all__`` is its public API, each importing only layers
above it in this list (memory and nvme sit side by side: neither imports the other;
tests/test_layering.py enforces it)::

    tiers.io        engines (io_uring, thread pool, GDS), buffers, Env, the error tree, the
                    CPU-thread budget and heap trimming, and IORuntime: one engine per loop,
                    executors and buffers every product shares
    tiers.storage   the Tier contract, extent allocator and growable space, write-ahead log,
                    LMDB helper, dir lock
    tiers.memory    HBM, DRAM and CXL tiers (one arena each), NUMA placement
    tiers.nvme      the persistent tier: checksummed records in extent files, LMDB catalog
    tiers.store     TieredStore, eviction policies, configuration (open_store)
    tiers.testing   contract suites and fault injectors, for tests only

This module re-exports what a user needs; products import from here or from a subpackage,
never from a module inside one.
"""

from tiers.io import (
    ENGINE_KINDS,
    PAGE_SIZE_BYTES,
    AlignedBufferPool,
    AlignmentError,
    CapacityError,
    ConfigError,
    CorruptionError,
    DirectIOUnsupportedError,
    EngineClosedError,
    EngineUnavailableError,
    Env,
    FileHandle,
    FileMissingError,
    GdsEngine,
    InvalidArgumentError,
    IOEngine,
    IORuntime,
    NoMemoryError,
    NoSpaceError,
    PermissionDeniedError,
    ReadRequest,
    StorageError,
    ThreadEngine,
    TierkitError,
    UnexpectedEOFError,
    UringEngine,
    WriteRequest,
    aligned_empty,
    create_engine,
    default_env,
    default_runtime,
)
from tiers.memory import CxlTier, DramTier, HbmTier
from tiers.nvme import NvmeTier
from tiers.storage import Tier
from tiers.store import TieredStore, load_config, open_store

__all__ = [
    "ENGINE_KINDS",
    "PAGE_SIZE_BYTES",
    "AlignedBufferPool",
    "AlignmentError",
    "CapacityError",
    "ConfigError",
    "CorruptionError",
    "CxlTier",
    "DirectIOUnsupportedError",
    "DramTier",
    "EngineClosedError",
    "EngineUnavailableError",
    "Env",
    "FileHandle",
    "FileMissingError",
    "GdsEngine",
    "HbmTier",
    "IOEngine",
    "IORuntime",
    "InvalidArgumentError",
    "NoMemoryError",
    "NoSpaceError",
    "NvmeTier",
    "PermissionDeniedError",
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
    "create_engine",
    "default_env",
    "default_runtime",
    "load_config",
    "open_store",
]
