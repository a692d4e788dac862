"""AccessTable: per vector id, where its home copy is, its tree leaf, and who may read it.

This is the access truth of the index: a search answers a tenant only with ids this table says
that tenant may read at that moment, whatever the shortlist pages hold (a revoked record may
still sit in a shortlist run until it is rewritten).

Storage (about 18 bytes per vector plus 4 per (vector, tenant) pair): ids sorted in one int64
array with parallel ``loc`` (the home copy: tenant_store; uint32 while every location fits,
else int64), ``leaf`` (uint16 while the tree has fewer than 65,536 nodes, else int32) and a
CSR of tenant numbers (``ptr`` [n + 1], uint32 while it fits, ``tenants`` int32, sorted per id);
changes since the last merge sit in a dict that overrides the arrays for its ids (None: the id
was removed). Per-tenant pair counts are kept as they change, so ``count`` costs nothing.

Thread-safety: loop thread only.
"""

from __future__ import annotations

import numpy as np

from vectordb.tenancy import access_batch
from vectordb.tenancy.access_batch import Entry
from vectordb.tenancy.access_batch import narrow as _narrow
from vectordb.tenancy.access_batch import sort_runs as _sort_runs

__all__ = ["AccessTable", "Entry"]

_MERGE_AT = 4096


class AccessTable:
    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)
        self._first: int | None = None  # ids are first .. first + len - 1: ``ids`` not held
        self.n_rows = 0
        self.loc = np.zeros(0, np.int64)
        self.leaf = np.zeros(0, np.int32)
        self.ptr = np.zeros(1, np.int64)
        self.tenants = np.zeros(0, np.int32)
        self.delta: dict[int, Entry | None] = {}
        self._delta_ids: np.ndarray | None = None
        self.counts = np.zeros(0, np.int64)  # pairs per tenant number
        self.n_ids = 0

    # ----------------------------------------------------------------- lookups
    def get(self, vid: int) -> Entry | None:
        if vid in self.delta:
            return self.delta[vid]
        at, hit = self._find(np.array([vid], np.int64))
        if not hit[0]:
            return None
        pos = int(at[0])
        a, b = int(self.ptr[pos]), int(self.ptr[pos + 1])  # uint32 or int64: as ints
        return Entry(int(self.loc[pos]), int(self.leaf[pos]), tuple(self.tenants[a:b].tolist()))

    def entries(self, ids: np.ndarray) -> list[Entry | None]:
        """``[get(v) for v in ids]`` with one search of the arrays for all of them."""
        return access_batch.entries(self, ids)

    def count(self, tenant: int) -> int:
        return int(self.counts[tenant]) if 0 <= tenant < len(self.counts) else 0

    def counts_of(self, tenants: np.ndarray) -> np.ndarray:
        """``count`` of each tenant number (0 for -1 and for numbers without a pair yet)."""
        inside = (tenants >= 0) & (tenants < len(self.counts))
        out = np.zeros(len(tenants), np.int64)
        out[inside] = self.counts[tenants[inside]]
        return out

    def member(self, ids: np.ndarray, tenants: np.ndarray) -> np.ndarray:
        """Mask: may tenant ``tenants[i]`` read id ``ids[i]``? (vectorised)"""
        return self._may_read(ids, np.asarray(tenants, np.int64), None)

    def readable(self, ids: np.ndarray, versions: np.ndarray, tenant: int) -> np.ndarray:
        """Mask of records (id, version) that ``tenant`` may read now, at the vector's
        current home location (one search of the table for both checks)."""
        return self._may_read(ids, np.full(len(ids), tenant, np.int64), versions)

    def readable_by(self, ids: np.ndarray, versions: np.ndarray, tenants: np.ndarray) -> np.ndarray:
        """``readable`` with a tenant per record (a batch of queries' records at once)."""
        return self._may_read(ids, np.asarray(tenants, np.int64), versions)

    def _may_read(
        self, ids: np.ndarray, tenants: np.ndarray, versions: np.ndarray | None
    ) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        out = np.zeros(len(ids), bool)
        if self.n_rows and len(ids):
            out = access_batch.may_read(self, ids, tenants, versions)
        if self.delta:
            for i in np.flatnonzero(np.isin(ids, self._delta_array())).tolist():
                entry = self.delta[int(ids[i])]
                out[i] = (
                    entry is not None
                    and int(tenants[i]) in entry.tenants
                    and (versions is None or (entry.loc & 0xFFFFFFFF) == int(versions[i]))
                )
        return out

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found mask, loc, leaf) of each id."""
        ids = np.asarray(ids, np.int64)
        found = np.zeros(len(ids), bool)
        loc = np.zeros(len(ids), np.int64)
        leaf = np.zeros(len(ids), np.int32)
        if self.n_rows and len(ids):
            pos, found = self._find(ids)
            loc[found] = self.loc[pos[found]].astype(np.int64)
            leaf[found] = self.leaf[pos[found]].astype(np.int32)
        if self.delta:
            for i in np.flatnonzero(np.isin(ids, self._delta_array())).tolist():
                entry = self.delta[int(ids[i])]
                found[i] = entry is not None
                if entry is not None:
                    loc[i], leaf[i] = entry.loc, entry.leaf
        return found, loc, leaf

    # ----------------------------------------------------------------- changes
    def put(self, vid: int, loc: int, leaf: int, tenants: tuple[int, ...]) -> None:
        """Add or replace an id (its tenants counted)."""
        self.remove(vid)
        self._set(vid, Entry(loc, leaf, tuple(sorted(set(tenants)))), counted=True)
        self.n_ids += 1

    def remove(self, vid: int) -> Entry | None:
        """Forget an id (uncounting its tenants); returns what it was."""
        entry = self.get(vid)
        if entry is not None:
            self._set(vid, None, counted=False)
            self._count(entry.tenants, -1)
            self.n_ids -= 1
        return entry

    def add_pair(self, vid: int, tenant: int) -> bool:
        return bool(self.add_pairs(np.array([vid], np.int64), tenant)[0])

    def remove_pair(self, vid: int, tenant: int) -> bool:
        return bool(self.remove_pairs(np.array([vid], np.int64), tenant)[0][0])

    def add_pairs(self, ids: np.ndarray, tenant: int) -> np.ndarray:
        """``add_pair`` of every id (in order: a repeated id counts once); mask of the pairs
        added. One search of the arrays for the whole batch."""
        return access_batch.change_pairs(self, np.asarray(ids, np.int64), tenant, adding=True)

    def remove_pairs(self, ids: np.ndarray, tenant: int) -> tuple[np.ndarray, np.ndarray]:
        """``remove_pair`` of every id; (mask of the pairs removed, each id's leaf)."""
        ids = np.asarray(ids, np.int64)
        leaves = self.lookup(ids)[2]
        return access_batch.change_pairs(self, ids, tenant, adding=False), leaves

    def remove_tenant(self, tenant: int) -> int:
        """Drop every pair of ``tenant``; returns how many there were."""
        dropped = self.count(tenant)
        keep = self.tenants != tenant
        if not keep.all():
            kept = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
            self.ptr = _narrow(kept[self.ptr])  # each id's run shrinks by its dropped pairs
            self.tenants = self.tenants[keep]
        for vid, entry in list(self.delta.items()):
            if entry is not None and tenant in entry.tenants:
                rest = tuple(t for t in entry.tenants if t != tenant)
                self.delta[vid] = entry._replace(tenants=rest)
        if tenant < len(self.counts):
            self.counts[tenant] = 0
        return dropped

    def _set(self, vid: int, entry: Entry | None, counted: bool, merge: bool = True) -> None:
        if vid not in self.delta:
            self._delta_ids = None
        self.delta[vid] = entry
        if counted and entry is not None:
            self._count(entry.tenants, 1)
        if merge:
            self._maybe_merge()

    def _maybe_merge(self) -> None:
        if len(self.delta) >= max(_MERGE_AT, self.n_rows // 32):
            self.merge()

    def _count(self, tenants: tuple[int, ...], step: int) -> None:
        if tenants and max(tenants) >= len(self.counts):
            grown = np.zeros(max(max(tenants) + 1, 2 * len(self.counts), 16), np.int64)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        for tenant in tenants:
            self.counts[tenant] += step

    def _delta_array(self) -> np.ndarray:
        if self._delta_ids is None:
            self._delta_ids = np.fromiter(self.delta.keys(), np.int64, len(self.delta))
        return self._delta_ids

    # ----------------------------------------------------------------- bulk forms
    def merge(self) -> None:
        """Fold the dict of changes into the arrays."""
        if not self.delta:
            return
        changed = self._delta_array()
        held = self.id_array()
        keep = ~np.isin(held, changed)
        all_lengths = np.asarray(np.diff(self.ptr.astype(np.int64)), np.int64)
        lengths = all_lengths[keep]
        pair_keep = np.repeat(keep, all_lengths)
        entries = [(vid, e) for vid, e in self.delta.items() if e is not None]
        new_ids = np.array([vid for vid, _ in entries], np.int64)
        new_lengths = np.array([len(e.tenants) for _, e in entries], np.int64)
        flat = [t for _, e in entries for t in e.tenants]
        self.load(
            np.concatenate([held[keep], new_ids]),
            np.concatenate([self.loc[keep].astype(np.int64), [e.loc for _, e in entries]]),
            np.concatenate([self.leaf[keep].astype(np.int32), [e.leaf for _, e in entries]]),
            np.concatenate([lengths, new_lengths]),
            np.concatenate([self.tenants[pair_keep], np.array(flat, np.int32)]),
            recount=False,
            sorted_runs=True,  # kept runs were sorted, and every Entry holds sorted tenants
        )
        self.delta.clear()
        self._delta_ids = None

    def load(
        self, ids: np.ndarray, loc: np.ndarray, leaf: np.ndarray, lengths: np.ndarray,
        tenants: np.ndarray, recount: bool = True, sorted_runs: bool = False,
    ) -> None:  # fmt: skip
        """Replace the arrays (ids in any order; ``tenants`` grouped by id in that order)."""
        order = np.argsort(ids, kind="stable")
        starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
        lengths = np.asarray(lengths, np.int64)[order]
        gather = np.repeat(starts[order], lengths) + (
            np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        )
        leaf = np.asarray(leaf)[order]
        small = not len(leaf) or (leaf.min() >= 0 and leaf.max() < 2**16)
        ids = np.asarray(ids, np.int64)[order]
        self.n_rows = len(ids)
        dense = self.n_rows > 0 and int(ids[-1]) - int(ids[0]) == self.n_rows - 1
        # ids that are one range (row numbers: the usual case) are not held: 8 bytes a vector
        self._first = int(ids[0]) if dense else None
        self.ids = ids[:0] if dense else ids
        self.loc = _narrow(loc[order])
        self.leaf = leaf.astype(np.uint16 if small else np.int32)  # trees rarely reach 64k nodes
        self.tenants = np.asarray(tenants, np.int32)[gather.astype(np.int64)]
        self.ptr = _narrow(np.concatenate([[0], np.cumsum(lengths)]))
        if not sorted_runs:
            _sort_runs(self.tenants, self.ptr)
        if recount:
            self.delta.clear()
            self._delta_ids = None
            self.n_ids = self.n_rows
            self.counts = np.bincount(self.tenants, minlength=16).astype(np.int64)

    def _find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each id, clipped to the table; whether it is there); needs rows."""
        if self._first is not None:
            pos = ids - self._first
            found = (pos >= 0) & (pos < self.n_rows)
            return np.where(found, pos, 0), found
        pos = np.minimum(np.searchsorted(self.ids, ids), max(self.n_rows - 1, 0))
        return pos, self.ids[pos] == ids if self.n_rows else np.zeros(len(ids), bool)

    def id_array(self) -> np.ndarray:
        """The held ids, sorted (made when they are one range)."""
        if self._first is not None:
            return np.arange(self._first, self._first + self.n_rows, dtype=np.int64)
        return self.ids

    def snapshot(self) -> dict[str, np.ndarray]:
        self.merge()
        return {
            "access_ids": self.id_array(),
            "access_loc": self.loc,
            "access_leaf": self.leaf,
            "access_ptr": self.ptr,
            "access_tenants": self.tenants,
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        self.load(
            arrays["access_ids"], arrays["access_loc"], arrays["access_leaf"],
            np.diff(arrays["access_ptr"].astype(np.int64)), arrays["access_tenants"],
        )  # fmt: skip

    def resident_bytes(self) -> int:
        arrays = (self.ids, self.loc, self.leaf, self.ptr, self.tenants, self.counts)
        return sum(a.nbytes for a in arrays) + 200 * len(self.delta)
