"""tiers.nvme: the persistent tier, checksummed object records in extent files, an LMDB catalog."""

from tiers.nvme.checksums import payload_crc32
from tiers.nvme.chunks import catalog_entry_bytes, chunk_log2_for, sum_chunks
from tiers.nvme.format import CHUNKED_FROM_BYTES, HEADER_BYTES, record_bytes
from tiers.nvme.nvme_tier import NvmeTier

__all__ = [
    "CHUNKED_FROM_BYTES",
    "HEADER_BYTES",
    "NvmeTier",
    "catalog_entry_bytes",
    "chunk_log2_for",
    "payload_crc32",
    "record_bytes",
    "sum_chunks",
]
