"""BlockIndex: the in-memory map from block hash to the object that holds it.

Each block is one object of the tiered store, named (byte-level spec, the one place it is
written and read)::

    kv/<namespace: 16 hex>/<block hash: hex>/<parent hash: hex, or "-">

The namespace is the model fingerprint's digest (with the codec's, when blocks are
compressed), so one model never sees another's blocks. The parent is in the name, not in a
side table, so a block and its chain link are stored and dropped in one catalog commit, and a
reopen rebuilds the whole index from the tier's key list: no block is read and no second
structure can disagree with the first.

Thread-safety: none; owned by one KVBlockStore (its loop thread).
Invariants: ``blocks[h].key`` names h; ``pins`` >= 0; a block's ``depth`` is its parent's + 1,
or 0 when its parent is not cached (computed once, when it is indexed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tiers import InvalidArgumentError

__all__ = ["MAX_HASH_BYTES", "BlockIndex", "BlockInfo", "block_key", "parse_block_key"]

MAX_HASH_BYTES = 120  # two of them in hex, plus the prefix, stay within a 511-byte key
_ROOT = "-"


def block_key(namespace: str, block_hash: bytes, parent: bytes | None) -> str:
    return f"kv/{namespace}/{block_hash.hex()}/{parent.hex() if parent else _ROOT}"


def parse_block_key(key: str) -> tuple[str, bytes, bytes | None] | None:
    """(namespace, hash, parent) of a block key; None for a key that is not one."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != "kv":
        return None
    try:
        parent = None if parts[3] == _ROOT else bytes.fromhex(parts[3])
        return parts[1], bytes.fromhex(parts[2]), parent
    except ValueError:
        return None


def check_hashes(hashes: Iterable[bytes]) -> list[bytes]:
    """The hashes as a list of bytes; InvalidArgumentError for anything else."""
    checked = []
    for block_hash in hashes:
        if not isinstance(block_hash, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"block hashes are bytes, got {type(block_hash).__name__}")
        block_hash = bytes(block_hash)
        if not 0 < len(block_hash) <= MAX_HASH_BYTES:
            raise InvalidArgumentError(
                f"a block hash has 1 to {MAX_HASH_BYTES} bytes, got {len(block_hash)}"
            )
        checked.append(block_hash)
    return checked


@dataclass(slots=True)
class BlockInfo:
    key: str
    parent: bytes | None
    depth: int
    pins: int = 0


class BlockIndex:
    """The cached blocks of one namespace, by hash."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.blocks: dict[bytes, BlockInfo] = {}
        self.by_key: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self.blocks)

    def add(self, block_hash: bytes, parent: bytes | None) -> BlockInfo:
        parent_info = self.blocks.get(parent) if parent is not None else None
        depth = parent_info.depth + 1 if parent_info is not None else 0
        info = BlockInfo(block_key(self.namespace, block_hash, parent), parent, depth)
        self.blocks[block_hash] = info
        self.by_key[info.key] = block_hash
        return info

    def remove(self, block_hash: bytes) -> BlockInfo | None:
        info = self.blocks.pop(block_hash, None)
        if info is not None:
            self.by_key.pop(info.key, None)
        return info

    def prefix_length(self, hashes: list[bytes]) -> int:
        """How many of ``hashes``, from the first, are cached."""
        blocks = self.blocks
        for count, block_hash in enumerate(hashes):
            if block_hash not in blocks:
                return count
        return len(hashes)

    def rebuild(self, keys: Iterable[str]) -> list[tuple[str, str | None, int]]:
        """Index every key of this namespace among ``keys`` (others are skipped); returns
        (key, parent's key or None when the parent is not cached, depth) of each block."""
        prefix = f"kv/{self.namespace}/"
        cut = len(prefix)
        parents: dict[bytes, bytes | None] = {}
        names: dict[bytes, str] = {}
        for key in keys:
            if not key.startswith(prefix):
                continue
            own, _, parent = key[cut:].partition("/")
            try:
                block_hash = bytes.fromhex(own)
                parents[block_hash] = None if parent == _ROOT else bytes.fromhex(parent)
            except ValueError:
                continue  # not a block key
            names[block_hash] = key
        depths = _depths(parents)
        rebuilt = []
        for block_hash, key in names.items():
            parent_hash = parents[block_hash]
            self.blocks[block_hash] = BlockInfo(key, parent_hash, depths[block_hash])
            self.by_key[key] = block_hash
            parent_key = names.get(parent_hash) if parent_hash else None
            rebuilt.append((key, parent_key, depths[block_hash]))
        return rebuilt


def _depths(parents: dict[bytes, bytes | None]) -> dict[bytes, int]:
    """Each block's depth: its parent's + 1, or 0 when its parent is not among them."""
    depths: dict[bytes, int] = {}
    for start in parents:
        path = []
        link: bytes | None = start
        while link is not None and link in parents and link not in depths:
            path.append(link)
            link = parents[link]
            if len(path) > len(parents):  # a cycle cannot come from sha256 chains
                break
        base = depths[link] + 1 if link is not None and link in depths else 0
        for depth, block_hash in enumerate(reversed(path), base):
            depths[block_hash] = depth
    return depths
