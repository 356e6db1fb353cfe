"""Recommendation at scale: hash embedding tables, sparse optimisers, sharding, CTR models.

The pieces, bottom up: ``hashtable`` (numba id -> row map, chunked rows), ``table``
(HashEmbeddingTable with metadata), ``policies`` (admission, eviction), ``optim`` (sparse
SGD / Adagrad / Adam / FTRL), ``kernels`` (dedupe, CSR bag pooling), ``sharded``
(pull/push shards, prefetch), ``sketch`` (IdStats: count-min and heavy hitters of the
id stream), ``hotcache`` (HotCache: the top ids' rows on the trainer, written back
to the shards), ``remote`` (Ray actor shards), ``snapshot`` (full + delta
export, serving), ``data``
(CSR batches, W4 click stream, Parquet), ``metrics`` (AUC, log loss) and ``models``
(HashEmbedding, DLRM, DeepFM, Wide&Deep, on the sampan core: train them with the ordinary
``opt.zero_grad(); loss.backward(); opt.step()`` loop).
"""

from sampan.rec.hashtable import ChunkedRows, HashMap, RowAllocator, hash_ids
from sampan.rec.hotcache import HotCache
from sampan.rec.kernels import bag_pool, bag_pool_backward, segment_sum, unique_inverse
from sampan.rec.metrics import LogLoss, StreamingAUC, auc
from sampan.rec.models import DLRM, DeepFM, HashEmbedding, WideAndDeep, predict, train_step
from sampan.rec.optim import SparseAdagrad, SparseAdam, SparseFTRL, SparseSGD
from sampan.rec.policies import (
    AdmitAll,
    CallableEviction,
    LFUEviction,
    MinCountAdmission,
    ProbabilisticAdmission,
    TTLEviction,
)
from sampan.rec.sketch import IdStats
from sampan.rec.sharded import LocalShard, Prefetcher, PulledBatch, ShardedEmbedding
from sampan.rec import remote as _remote  # noqa: F401  (registers backend="ray"; ray loads on use)
from sampan.rec.snapshot import (
    ServingTable,
    SnapshotError,
    export_delta,
    export_full,
    export_sharded,
    reshard,
    restore,
    restore_sharded,
)
from sampan.rec.table import HashEmbeddingTable, hashed_normal

__all__ = [
    "DLRM",
    "AdmitAll",
    "CallableEviction",
    "ChunkedRows",
    "DeepFM",
    "HashEmbedding",
    "HashEmbeddingTable",
    "HashMap",
    "HotCache",
    "IdStats",
    "LFUEviction",
    "LocalShard",
    "LogLoss",
    "MinCountAdmission",
    "Prefetcher",
    "ProbabilisticAdmission",
    "PulledBatch",
    "RowAllocator",
    "ServingTable",
    "ShardedEmbedding",
    "SnapshotError",
    "SparseAdagrad",
    "SparseAdam",
    "SparseFTRL",
    "SparseSGD",
    "StreamingAUC",
    "TTLEviction",
    "WideAndDeep",
    "auc",
    "bag_pool",
    "bag_pool_backward",
    "export_delta",
    "export_full",
    "export_sharded",
    "hash_ids",
    "hashed_normal",
    "predict",
    "reshard",
    "restore",
    "restore_sharded",
    "segment_sum",
    "train_step",
    "unique_inverse",
]
