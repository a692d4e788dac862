"""dataload: a globally shuffled, exactly resumable loader on the tierkit I/O core (issue 5).

``ShuffledLoader`` replaces torch's DataLoader in a training loop. Sources read a batch of sample
indices through the I/O core in one submission: ``FixedSizeSource`` (raw records),
``RecordFileSource`` (tierkit record files, fixed or variable size; ``RecordWriter`` builds them),
``ArrowSource`` (Arrow IPC), ``ParquetSource``, ``LmdbSource`` (a key per sample) and
``DirectorySource`` (a file per sample). Any map-style ``torch.utils.data.Dataset`` works too
(``DatasetSource``; the optional located-bytes protocol ``LocatedDataset`` lets the I/O core read
its samples, as ``ImageFolder`` does), and ``num_workers`` runs per-sample Python in worker
processes fed through shared memory (``dataload.workers``; issue 19).
"""

from dataload.arrow_source import ArrowSource
from dataload.dataset_source import DatasetSource
from dataload.directory_source import DirectorySource
from dataload.errors import (
    CorruptSampleError,
    SampleError,
    SampleIndexError,
    SampleReadError,
    SourceError,
    SourceFormatError,
    TransformError,
)
from dataload.image_folder import ImageFolder, pil_to_tensor
from dataload.lmdb_source import LmdbSource, index_key, write_lmdb
from dataload.loader import ShuffledLoader
from dataload.located import LocatedDataset, is_located
from dataload.order import RankPlan, epoch_order, rank_slice
from dataload.parquet_source import ParquetSource
from dataload.record_source import FixedSizeSource, RecordFileSource
from dataload.record_writer import RecordWriter, write_records
from dataload.shards import MDSShards, TarShards
from dataload.source import SampleBatch, Source, read_samples
from dataload.workers import WorkerDiedError, WorkerError

__all__ = [
    "ArrowSource",
    "CorruptSampleError",
    "DatasetSource",
    "DirectorySource",
    "FixedSizeSource",
    "ImageFolder",
    "LmdbSource",
    "LocatedDataset",
    "MDSShards",
    "ParquetSource",
    "RankPlan",
    "RecordFileSource",
    "RecordWriter",
    "SampleBatch",
    "SampleError",
    "SampleIndexError",
    "SampleReadError",
    "ShuffledLoader",
    "Source",
    "SourceError",
    "SourceFormatError",
    "TarShards",
    "TransformError",
    "WorkerDiedError",
    "WorkerError",
    "epoch_order",
    "index_key",
    "is_located",
    "pil_to_tensor",
    "rank_slice",
    "read_samples",
    "write_lmdb",
    "write_records",
]
