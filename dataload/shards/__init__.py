"""dataload.shards: sharded archives as loader datasets (issue 19, item 3).

``TarShards`` reads WebDataset-style tar shards (members grouped by key, indexed once into a
sidecar per shard: ``tar_sidecar.py`` holds the byte-level format) and ``MDSShards`` reads Mosaic
Streaming MDS shards (``index.json`` + ``shard.NNNNN.mds``, uncompressed). Both are map-style
Datasets implementing :mod:`dataload.located`, so ``ShuffledLoader`` reads every sample as one
ranged read batched on the I/O core, with a global shuffle across all shards, rank slicing,
exact resume and process workers; DataLoader can use them too.

Concurrency: the datasets are immutable after construction (see each module).
"""

from dataload.shards.mds_shards import MDSShards
from dataload.shards.tar_shards import TarShards, expand_shards

__all__ = ["MDSShards", "TarShards", "expand_shards"]
