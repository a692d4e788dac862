"""Checkpoints: the index's whole in-memory state to LMDB, and back at open (plus log replay).

Order of a checkpoint (under the update lock, so no update is half applied):

1. fdatasync ``postings.dat``: every page the new state points at is durable;
2. start a new log segment: updates from now on go there;
3. commit the state to LMDB in one transaction (it names the new segment as the replay start);
4. delete the older segments; give runs freed since the last checkpoint back to the allocator,
   once searches that may still read them have finished.

A crash before 3 leaves the old checkpoint and its log (the new segment is replayed too, empty
or not); after 3, the new checkpoint. Open = load the checkpoint, replay segments >= its start
(the log checks that none is missing and that LSNs run on from the checkpoint's).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from vectordb.meta import Checkpoint
from vectordb.probe_rule import STATE_KEY, saved_postings
from vectordb.tenancy import logged
from vectordb.tenancy.wal_records import TENANT_KINDS
from vectordb.version_map import VersionMap
from vectordb.wal import DELETE

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["checkpoint", "load_checkpoint", "write_checkpoint"]


async def checkpoint(index: SpannIndex) -> None:
    async with index.update_lock:
        if index.tenancy is not None:  # revokes' deferred merges and rewrites, then sync
            await index.tenancy.settle_pending()
        await index.store.sync()
        if index.tenancy is not None:
            await index.tenancy.store.lists.sync()
        await index.wal.start_segment(index.wal.seq + 1)
        await write_checkpoint(index)
        index.wal.drop_segments_before(index.wal.seq)
        freed = index.store.space.take_pending()
        readers = list(index.searches)
    index.counters["checkpoints"] += 1
    if readers:  # a search that started earlier may still be reading a freed run
        await asyncio.gather(*readers, return_exceptions=True)
    index.store.space.release_pending(freed)


async def write_checkpoint(index: SpannIndex) -> None:
    lsn = index.wal.next_lsn
    head_pids, head_vectors = index.navigator.snapshot()
    version_ids, versions = index.versions.snapshot()
    directory = index.store.snapshot()
    state = {
        "wal_seq": index.wal.seq,
        "next_lsn": index.wal.next_lsn,
        "next_pid": index.next_pid,
        "navigator_kind": index.navigator.kind,
    }
    entry = index.measure_entry
    if entry is not None and saved_postings({STATE_KEY: entry}, index.navigator.n_heads):
        # the heads are those it was measured on: kept, and not measured again (fit_memory)
        state[STATE_KEY] = entry
        index.saved_measure = {STATE_KEY: entry}
    arrays = {
        "head_pids": head_pids,
        "head_vectors": head_vectors,
        "version_ids": version_ids,
        "versions": versions,
        "posting_start": directory["start"],
        "posting_capacity": directory["capacity"],
        "posting_count": directory["count"],
    }
    if index.tenancy is not None:
        tenancy_state, tenancy_arrays = index.tenancy.snapshot()
        state["tenancy"] = tenancy_state
        arrays.update(tenancy_arrays)
    snapshot = Checkpoint(index.config.to_dict(), state, arrays)
    await index.runtime.run_blocking(index.meta.write, snapshot)
    index.checkpointed_lsn = lsn


async def load_checkpoint(index: SpannIndex) -> None:
    from vectordb.updates import apply_insert

    saved = index.meta.read(narrow=index.memory.narrow)
    assert saved is not None
    arrays = saved.arrays
    index.navigator.add(arrays.pop("head_vectors"), arrays["head_pids"], take=True)
    index.versions = VersionMap(arrays["version_ids"], arrays["versions"])
    index.store.restore(
        arrays["posting_start"], arrays["posting_capacity"], arrays["posting_count"]
    )
    index.next_pid = int(saved.state["next_pid"])
    index.saved_measure = {STATE_KEY: saved.state.get(STATE_KEY)}  # for fit_memory
    index.wal.next_lsn = int(saved.state["next_lsn"])  # the log runs on from it, one a record
    if index.tenancy is not None and "tenancy" in saved.state:
        index.tenancy.restore(saved.state["tenancy"], arrays)
    config = index.config
    async for record in index.wal.recover(
        int(saved.state["wal_seq"]), config.dim, config.numpy_dtype
    ):
        if record.kind == DELETE:
            index.versions.delete(record.ids)
            if index.tenancy is not None:
                await index.tenancy.apply_delete(record.ids)
        elif record.kind in TENANT_KINDS:
            await logged.replay(index, record)
        else:
            assert record.vectors is not None
            fresh = ~index.versions.is_live(record.ids)  # replay is idempotent
            await apply_insert(index, record.ids[fresh], record.vectors[fresh])
        index.counters["wal_replayed"] += 1
    if not index.counters["wal_replayed"]:
        index.checkpointed_lsn = index.wal.next_lsn  # the checkpoint is the whole state
