"""Indexing a tar shard once: members grouped into samples as WebDataset groups them, cached in
a sidecar.

Grouping follows ``webdataset.tariterators`` so a shard yields the same samples under both:
members are taken in archive order; a member whose name matches ``__*__`` at the top is metadata
and skipped; a name splits into key and extension at the first dot of its last path component
(``train/0001.seg.png`` -> key ``train/0001``, extension ``seg.png``; extensions lowercased); a
name with no such dot is skipped; consecutive members with the same key form one sample, and a
key that comes back after another key starts a new sample. Two members of one sample with the
same extension are an error (WebDataset raises too).

:func:`load_index` returns a shard's index from its sidecar when the sidecar is fresh (the
shard's size and mtime are the ones recorded), else scans the shard and writes a new sidecar:
next to the shard (``<shard>.tkidx``) when that folder is writable, else in ``cache_dir`` under a
name derived from the shard's absolute path. A shard changed after indexing is therefore
re-indexed on the next open, never read with a stale index.

Concurrency: several processes may index the same shard at once; each writes its sidecar
atomically, and every writer produces the same bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

import numpy as np

from dataload.errors import SourceFormatError
from dataload.shards.tar_scan import TarMember, scan_tar
from dataload.shards.tar_sidecar import SIDECAR_SUFFIX, ShardIndex, read_sidecar, write_sidecar
from tiers.io import map_os_errors

__all__ = ["build_index", "default_cache_dir", "load_index", "sidecar_paths", "split_name"]

log = logging.getLogger("tierkit.dataload")

_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def default_cache_dir() -> str:
    """``$TIERKIT_CACHE_DIR/tar-index``, else ``$XDG_CACHE_HOME/tierkit/tar-index``, else
    ``~/.cache/tierkit/tar-index``."""
    root = os.environ.get("TIERKIT_CACHE_DIR")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "tierkit")
    return os.path.join(root, "tar-index")


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name as WebDataset splits it; None: not a sample file."""
    if _META.match(name):
        return None
    match = _KEY_EXT.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


def build_index(path: str, stat: os.stat_result) -> ShardIndex:
    """Scan the shard at ``path`` (whose ``os.stat`` is ``stat``) and group its members."""
    members: list[TarMember] = scan_tar(path)
    fields: dict[str, int] = {}
    keys: list[str] = []
    first: list[int] = []
    offsets: list[int] = []
    sizes: list[int] = []
    field_ids: list[int] = []
    seen: set[str] = set()
    for member in members:
        split = split_name(member.name)
        if split is None:
            continue
        key, ext = split
        if not keys or key != keys[-1]:
            keys.append(key)
            first.append(len(offsets))
            seen = set()
        if ext in seen:
            raise SourceFormatError(path, f"{member.name}: a second {ext!r} in sample {key!r}")
        seen.add(ext)
        offsets.append(member.data_offset)
        sizes.append(member.size_bytes)
        field_ids.append(fields.setdefault(ext, len(fields)))
    first.append(len(offsets))
    return ShardIndex(
        stat.st_size,
        stat.st_mtime_ns,
        np.array(first, np.int64),
        np.array(offsets, np.int64),
        np.array(sizes, np.int64),
        np.array(field_ids, np.int32),
        keys,
        list(fields),
    )


def sidecar_paths(path: str, cache_dir: str | None) -> tuple[str, str]:
    """(next to the shard, in the cache folder) -- where the sidecar of ``path`` may be."""
    absolute = os.path.abspath(path)
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    cached = os.path.join(
        cache_dir or default_cache_dir(), f"{digest}-{os.path.basename(path)}{SIDECAR_SUFFIX}"
    )
    return absolute + SIDECAR_SUFFIX, cached


def load_index(path: str, cache_dir: str | None = None) -> tuple[ShardIndex, bool]:
    """The shard's index and whether it was (re)built now (False: read from a fresh sidecar)."""
    with map_os_errors(path):
        stat = os.stat(path)
    beside, cached = sidecar_paths(path, cache_dir)
    for candidate in (beside, cached):
        index = read_sidecar(candidate)
        if index is not None and index.fresh_for(stat):
            return index, False
    index = build_index(path, stat)
    try:
        write_sidecar(beside, index)
    except OSError:
        try:
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            write_sidecar(cached, index)
        except OSError as exc:  # still usable: this process keeps the index it built
            log.warning("%s: no sidecar written (%s next to it, %s: %s)", path, beside, cached, exc)
    return index, True
