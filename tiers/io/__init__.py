"""tiers.io: the async I/O core. Engines, caller-owned buffers, the OS seam and the error tree.

Nothing here knows about tiers or objects: an engine reads and writes byte ranges of files into
buffers the caller owns. ``create_engine`` picks io_uring, else the thread pool.
"""

from tiers.io.batch import IOBatch, Op, ReadRequest, WriteRequest
from tiers.io.bounce import BounceBuffers
from tiers.io.buffer_cache import BufferCache
from tiers.io.buffers import PAGE_SIZE_BYTES, BufferRef, aligned_empty, as_buffer
from tiers.io.byte_views import is_tensor
from tiers.io.cpu_threads import single_threaded_blas, this_thread_openmp_alone, torch_openmp
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.env import Env, default_env
from tiers.io.errors import (
    AlignmentError,
    CapacityError,
    ConfigError,
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
    map_os_errors,
)
from tiers.io.factory import ENGINE_KINDS, create_engine
from tiers.io.gds import GdsEngine
from tiers.io.heap import cap_heap_retention, trim_heap
from tiers.io.pool import AlignedBufferPool, PooledBuffer
from tiers.io.runtime import IORuntime, default_runtime
from tiers.io.threaded import ThreadEngine
from tiers.io.uring import UringEngine

__all__ = [
    "ENGINE_KINDS",
    "PAGE_SIZE_BYTES",
    "AlignedBufferPool",
    "AlignmentError",
    "BounceBuffers",
    "BufferCache",
    "BufferRef",
    "CapacityError",
    "ConfigError",
    "CorruptionError",
    "DirectIOUnsupportedError",
    "EngineClosedError",
    "EngineUnavailableError",
    "Env",
    "FileHandle",
    "FileMissingError",
    "GdsEngine",
    "IOBatch",
    "IOEngine",
    "IORuntime",
    "InvalidArgumentError",
    "NoMemoryError",
    "NoSpaceError",
    "Op",
    "PermissionDeniedError",
    "PooledBuffer",
    "ReadRequest",
    "StorageError",
    "ThreadEngine",
    "TierkitError",
    "UnexpectedEOFError",
    "UringEngine",
    "WriteRequest",
    "aligned_empty",
    "as_buffer",
    "cap_heap_retention",
    "create_engine",
    "default_env",
    "default_runtime",
    "is_tensor",
    "map_os_errors",
    "single_threaded_blas",
    "this_thread_openmp_alone",
    "torch_openmp",
    "trim_heap",
]
