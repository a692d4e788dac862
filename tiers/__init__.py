"""tiers: the async I/O core and (later) the tiered store every tierkit product is built on."""

from tiers.batch import IOBatch, Op, ReadRequest, WriteRequest
from tiers.buffers import PAGE_SIZE_BYTES, BufferRef, aligned_empty, as_buffer
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
from tiers.pool import AlignedBufferPool, PooledBuffer
from tiers.threaded import ThreadEngine
from tiers.uring import UringEngine

__all__ = [
    "ENGINE_KINDS",
    "PAGE_SIZE_BYTES",
    "AlignedBufferPool",
    "AlignmentError",
    "BufferRef",
    "CapacityError",
    "CorruptionError",
    "DirectIOUnsupportedError",
    "EngineClosedError",
    "EngineUnavailableError",
    "Env",
    "FaultyEngine",
    "FaultyEnv",
    "FileHandle",
    "FileMissingError",
    "GdsEngine",
    "IOBatch",
    "IOEngine",
    "InvalidArgumentError",
    "NoSpaceError",
    "Op",
    "PermissionDeniedError",
    "PooledBuffer",
    "PowerCutReport",
    "ReadRequest",
    "StorageError",
    "ThreadEngine",
    "TierkitError",
    "UnexpectedEOFError",
    "UringEngine",
    "WriteRequest",
    "aligned_empty",
    "as_buffer",
    "create_engine",
    "default_env",
]
