"""dataload: a globally shuffled, exactly resumable loader on the tierkit I/O core (issue 5).

``ShuffledLoader`` replaces torch's DataLoader in a training loop. Sources read a batch of sample
indices through the I/O core in one submission: ``FixedSizeSource`` (raw records),
``RecordFileSource`` (tierkit record files, fixed or variable size; ``RecordWriter`` builds them),
``ArrowSource`` (Arrow IPC), ``ParquetSource``, ``LmdbSource`` (a key per sample) and
``DirectorySource`` (a file per sample).
"""

from dataload.arrow_source import ArrowSource
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
from dataload.lmdb_source import LmdbSource, index_key, write_lmdb
from dataload.loader import ShuffledLoader
from dataload.order import RankPlan, epoch_order, rank_slice
from dataload.parquet_source import ParquetSource
from dataload.record_source import FixedSizeSource, RecordFileSource
from dataload.record_writer import RecordWriter, write_records
from dataload.source import SampleBatch, Source, read_samples

__all__ = [
    "ArrowSource",
    "CorruptSampleError",
    "DirectorySource",
    "FixedSizeSource",
    "LmdbSource",
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
    "TransformError",
    "epoch_order",
    "index_key",
    "rank_slice",
    "read_samples",
    "write_lmdb",
    "write_records",
]
