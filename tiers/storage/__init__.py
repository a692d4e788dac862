"""tiers.storage: durable-file primitives every persistent tier and product shares.

The Tier contract, an extent allocator and the growable space built on it (frees deferred by
pin and by epoch), the write-ahead log of opaque records, LMDB environments (opened checked,
grown, group-committed) and sealed records in them, the directory lock and fsync, the
bookkeeping of in-flight operations, and the checks that turn settings into ConfigErrors.
"""

from tiers.storage.config_checks import Check, boolean, choice, integer, number, optional, text
from tiers.storage.directory import fsync_directory, lock_directory, unlock_directory
from tiers.storage.extents import ExtentAllocator
from tiers.storage.lmdb_env import LmdbWriter, lmdb_errors, open_lmdb, write_growing
from tiers.storage.lmdb_records import check_lmdb_file, seal, unseal
from tiers.storage.op_guard import OpGuard
from tiers.storage.space import GrowableSpace
from tiers.storage.tier import ByteRange, Tier
from tiers.storage.wal import LogRecord, RecordCheck, RecordLog

__all__ = [
    "ByteRange",
    "Check",
    "ExtentAllocator",
    "GrowableSpace",
    "LmdbWriter",
    "LogRecord",
    "OpGuard",
    "RecordCheck",
    "RecordLog",
    "Tier",
    "boolean",
    "check_lmdb_file",
    "choice",
    "fsync_directory",
    "integer",
    "lmdb_errors",
    "lock_directory",
    "number",
    "open_lmdb",
    "optional",
    "seal",
    "text",
    "unlock_directory",
    "unseal",
    "write_growing",
]
