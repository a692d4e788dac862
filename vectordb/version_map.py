"""VersionMap: the current version of every id the index has seen (SPFresh's version map).

A record on disk is valid only while its ``version`` equals the id's current version here, so
deleting an id (set the DELETED bit) or moving a vector to other lists (bump the version and
write new copies) invalidates every older copy at once, without touching the disk.

Versions start at 1; 0 means "never seen". Deleted ids keep their tombstone so that their stale
copies stay invisible, and a re-insert continues from the old version.

Storage: ids sorted in one int64 array with a parallel uint32 array (12 bytes per id, looked up
with one vectorised ``searchsorted``, or by plain indexing while the ids form one range),
plus a small dict of ids added since the last merge.
Concurrency: loop thread only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DELETED", "VersionMap"]

DELETED = np.uint32(1 << 31)
_MERGE_AT = 4096


class VersionMap:
    def __init__(self, ids: np.ndarray | None = None, versions: np.ndarray | None = None):
        self._ids = np.zeros(0, np.int64) if ids is None else np.asarray(ids, np.int64)
        self._versions = (
            np.zeros(0, np.uint32) if versions is None else np.asarray(versions, np.uint32)
        )
        self._delta: dict[int, int] = {}
        self._live = int(((self._versions & DELETED) == 0).sum())

    def __len__(self) -> int:
        return len(self._ids) + len(self._delta)

    @property
    def live_count(self) -> int:
        return self._live

    def get(self, ids: np.ndarray) -> np.ndarray:
        """Current versions (uint32, 0 for ids never seen)."""
        ids = np.asarray(ids, np.int64)
        out = np.zeros(len(ids), np.uint32)
        n = len(self._ids)
        if n and self._ids[-1] - self._ids[0] == n - 1:
            # the sorted, distinct ids are one range (say, row numbers): index, don't search
            pos = ids - self._ids[0]
            hit = (pos >= 0) & (pos < n)
            out[hit] = self._versions[pos[hit]]
        elif n:
            pos = np.searchsorted(self._ids, ids)
            pos_c = np.minimum(pos, n - 1)
            hit = self._ids[pos_c] == ids
            out[hit] = self._versions[pos_c[hit]]
        else:
            hit = np.zeros(len(ids), bool)
        if self._delta:
            for i in np.flatnonzero(~hit).tolist():
                out[i] = self._delta.get(int(ids[i]), 0)
        return out

    def valid(self, ids: np.ndarray, versions: np.ndarray) -> np.ndarray:
        """Mask of records (id, version) that are the current, live copy."""
        return self.get(ids) == np.asarray(versions, np.uint32)

    def is_live(self, ids: np.ndarray) -> np.ndarray:
        current = self.get(ids)
        return (current != 0) & ((current & DELETED) == 0)

    def set(self, ids: np.ndarray, versions: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        versions = np.asarray(versions, np.uint32)
        before = self.get(ids)
        self._live += int(_alive(versions).sum()) - int(_alive(before).sum())
        if len(self._ids):
            pos = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
            hit = self._ids[pos] == ids
            self._versions[pos[hit]] = versions[hit]
        else:
            hit = np.zeros(len(ids), bool)
        for i in np.flatnonzero(~hit).tolist():
            self._delta[int(ids[i])] = int(versions[i])
        if len(self._delta) >= max(_MERGE_AT, len(self._ids) // 64):
            self._merge()

    def next_versions(self, ids: np.ndarray) -> np.ndarray:
        """The version a (re-)written copy of each id gets: one past the current one."""
        return (self.get(ids) & ~DELETED) + np.uint32(1)

    def delete(self, ids: np.ndarray) -> np.ndarray:
        """Tombstone live ids; returns the mask of those that were live."""
        current = self.get(ids)
        live = _alive(current)
        if live.any():
            self.set(np.asarray(ids)[live], current[live] | DELETED)
        return live

    def _merge(self) -> None:
        if not self._delta:
            return
        new_ids = np.fromiter(self._delta.keys(), np.int64, len(self._delta))
        new_versions = np.fromiter(self._delta.values(), np.uint32, len(self._delta))
        ids = np.concatenate([self._ids, new_ids])
        order = np.argsort(ids, kind="stable")
        self._ids = ids[order]
        self._versions = np.concatenate([self._versions, new_versions])[order]
        self._delta.clear()

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self._ids, self._versions

    def resident_bytes(self) -> int:
        return self._ids.nbytes + self._versions.nbytes + len(self._delta) * 100


def _alive(versions: np.ndarray) -> np.ndarray:
    return (versions != 0) & ((versions & DELETED) == 0)
