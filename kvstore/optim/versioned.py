"""VersionedState: the subgroup objects of one optimizer, their versions and manifests.

Every write of a subgroup goes to a new key (manifest.object_key with a version number never
used before in this tier: one past the highest found on open, so keys left by a crashed step or
held by a checkpoint are never overwritten). ``commit`` streams the subgroups of a step through
the staging buffers, writes them, then writes the manifest that names them: the commit point.
Superseded objects are deleted after the commit on a persistent tier (before it they are the
state a crash falls back to) and as soon as their successor is stored on a memory tier (no
crash to survive; no second copy of the state in DRAM). Objects a named checkpoint holds are
never deleted; ``collect_garbage`` deletes every object no manifest names (what a crash left).

Thread-safety: one optimizer, one thread at a time (the tier's I/O runs on its loop thread).
Invariants: the committed manifest names, for every subgroup, an object that exists in the
tier; after a crash the tier holds every object the last committed manifest names.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from kvstore.optim.layout import OffloadError, Subgroup
from kvstore.optim.manifest import (
    OBJECT_PREFIX,
    Manifest,
    checkpoint_key,
    object_key,
    parse_object_key,
    referenced_keys,
)
from kvstore.optim.pipeline import Staging, stream
from kvstore.optim.state_tier import StateTier

__all__ = ["VersionedState"]

Compute = Callable[[Subgroup, int], Any]


def no_read(subgroup: Subgroup, slot: int) -> concurrent.futures.Future[Any]:
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.set_result(None)
    return done


class VersionedState:
    def __init__(
        self,
        tier: StateTier,
        staging: Staging,
        subgroups: Sequence[Subgroup],
        sections: int,
        signature: dict[str, Any],
    ) -> None:
        self.tier, self.staging = tier, staging
        self.subgroups, self.sections, self.signature = list(subgroups), sections, signature
        self.checkpoints: dict[str, Manifest] = tier.checkpoints() if tier.persistent else {}
        found = [v for k in tier.keys(OBJECT_PREFIX) if (v := parse_object_key(k))]
        self._next_version = 1 + max((version for _, version in found), default=0)
        self.manifest = Manifest(signature, 0, [0] * len(self.subgroups))

    def open(self, initialise: Compute, sums: Callable[[Subgroup], int] | None = None) -> bool:
        """Adopt the committed state of the tier (True), after checking it is one for these
        parameters and this optimizer; or, if it holds none, write version 0 of every
        subgroup made by ``initialise(subgroup, slot)`` (returns its scalars) and commit it."""
        found = self.tier.load_manifest()
        if found is not None:
            found.check(self.signature, self.tier.where)
            self.manifest = found
        else:
            self.commit(self.subgroups, initialise, read=False, scalars={}, first=True, sums=sums)
        self.collect_garbage()
        return found is not None

    def _slot_bytes(self, subgroup: Subgroup, slot: int) -> Any:
        return self.staging.slot_bytes(slot, subgroup.object_bytes(self.sections))

    def read_committed(self, subgroup: Subgroup, slot: int) -> concurrent.futures.Future[Any]:
        key = object_key(subgroup.index, self.manifest.versions[subgroup.index])
        return self.tier.read(key, self._slot_bytes(subgroup, slot))

    def scan(self, compute: Callable[[Subgroup, int], None]) -> None:
        """Read every committed subgroup in turn and ``compute`` on it; nothing is written."""
        slots = len(self.staging.slots)
        stream(self.subgroups, slots, self.read_committed, compute, lambda batch: None)

    def commit(
        self,
        todo: Sequence[Subgroup],
        compute: Compute,
        *,
        read: bool = True,
        scalars: dict[int, Any] | None = None,
        first: bool = False,
        sums: Callable[[Subgroup], int] | None = None,
    ) -> None:
        """Read (unless not ``read``), ``compute`` (returns the scalars of the parameters it
        holds) and write each subgroup of ``todo`` under a new version, then commit a manifest
        with the step advanced; ``scalars`` replaces the committed scalars (None: keeps them,
        updated by ``compute``); ``sums`` (master="params") gives each computed subgroup's
        parameter fingerprint for the manifest."""
        tier, old = self.tier, self.manifest
        version = 0 if first else self._next_version
        self._next_version = max(self._next_version, version + 1)
        base = dict(old.scalars if scalars is None else scalars)
        new = Manifest(self.signature, 0 if first else old.step + 1, list(old.versions), base)
        if sums is not None:
            new.param_sums = list(old.param_sums or [0] * len(self.subgroups))
        keep = referenced_keys(self.checkpoints.values())

        def compute_one(subgroup: Subgroup, slot: int) -> None:
            new.scalars.update(compute(subgroup, slot))
            if sums is not None:
                assert new.param_sums is not None
                new.param_sums[subgroup.index] = sums(subgroup)

        def write_batch(batch: list[tuple[Subgroup, int]]) -> Any:
            objects = []
            for subgroup, slot in batch:
                previous = object_key(subgroup.index, old.versions[subgroup.index])
                new.versions[subgroup.index] = version
                drop = None if first or tier.persistent or previous in keep else previous
                key = object_key(subgroup.index, version)
                objects.append((key, self._slot_bytes(subgroup, slot), drop))
            return tier.write_many(objects)

        slots = len(self.staging.slots)
        stream(todo, slots, self.read_committed if read else no_read, compute_one, write_batch)
        tier.save_manifest(new)
        self.manifest = new
        if tier.persistent and not first:
            stale = {object_key(s.index, old.versions[s.index]) for s in todo}
            tier.delete(stale - keep - referenced_keys([new]))

    def collect_garbage(self) -> None:
        keep = referenced_keys([self.manifest, *self.checkpoints.values()])
        self.tier.delete(k for k in self.tier.keys(OBJECT_PREFIX) if k not in keep)

    # ------------------------------------------------------------------ named checkpoints
    def checkpoint(self, name: str, verify: bool) -> None:
        key = checkpoint_key(name)
        if not self.tier.persistent:
            raise OffloadError("checkpoint() needs a persistent (nvme) tier; use state_dict()")
        if verify:  # every object read back through the tier's checksums
            self.scan(lambda s, i: None)
        self.tier.save_manifest(self.manifest, key)
        replaced = self.checkpoints.get(name)
        self.checkpoints[name] = self.manifest
        if replaced is not None:  # a name taken again: the objects only it held go
            self.collect_garbage()

    def restore(self, name: str, check: Callable[[Manifest], None] | None = None) -> None:
        """Make checkpoint ``name`` the committed state (``check`` may refuse it first)."""
        found = self.tier.load_manifest(checkpoint_key(name))
        if found is None:
            raise OffloadError(f"no checkpoint {name!r} in {self.tier.where}")
        found.check(self.signature, f"{self.tier.where} checkpoint {name!r}")
        if check is not None:
            check(found)
        self.tier.save_manifest(found)
        self.manifest = found
        self.collect_garbage()

    def delete_checkpoint(self, name: str) -> None:
        key = checkpoint_key(name)
        self.checkpoints.pop(name, None)
        self.tier.delete([key])
        self.collect_garbage()
