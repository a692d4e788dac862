"""dataload.workers: the loader's worker processes, fed through shared memory (issue 19).

``ShuffledLoader(..., num_workers=N)`` runs per-sample Python (a transform, a Dataset's
``__getitem__``/``decode``, a ``collate_fn``) in N processes from multiprocessing's forkserver
(:mod:`~dataload.workers.pool`). The I/O core reads into shared-memory slabs
(:mod:`~dataload.workers.shm`), a worker transforms its batch in place and writes the collated
tensors into another slab; only small task records cross the pipes
(:mod:`~dataload.workers.protocol`). :class:`ProcessFetcher` ties this to the loader.

As with DataLoader under spawn or forkserver (its default on macOS), the work goes to the
workers by pickle -- a transform must be a module-level function, not a lambda (a loader given
one runs it in threads instead and says so) -- and the forkserver imports the main script, so a
script starting a loader needs ``if __name__ == "__main__":``.
"""

from dataload.workers.fetcher import ProcessFetcher
from dataload.workers.pool import ProcessPool, forkserver_context, warm_forkserver
from dataload.workers.protocol import WorkerDiedError, WorkerError
from dataload.workers.shm import ShmSlabPool, remove_orphans, shm_names

__all__ = [
    "ProcessFetcher",
    "ProcessPool",
    "ShmSlabPool",
    "WorkerDiedError",
    "WorkerError",
    "forkserver_context",
    "remove_orphans",
    "shm_names",
    "warm_forkserver",
]
