"""Recommendation at scale: hash embedding tables, sparse optimisers, sharding, CTR models."""

from sampan.rec.hashtable import ChunkedRows, HashMap, RowAllocator, hash_ids

__all__ = ["ChunkedRows", "HashMap", "RowAllocator", "hash_ids"]
