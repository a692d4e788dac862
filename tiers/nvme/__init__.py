"""tiers.nvme: the persistent tier, checksummed object records in extent files, an LMDB catalog."""

from tiers.nvme.format import HEADER_BYTES, record_bytes
from tiers.nvme.nvme_tier import NvmeTier

__all__ = ["HEADER_BYTES", "NvmeTier", "record_bytes"]
