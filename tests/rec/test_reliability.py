"""Reliability: 10^7 distinct ids streamed into a table capped at 10^6 rows."""

import os
import time

import numpy as np
import pytest

from sampan.rec.optim import SparseAdagrad
from sampan.rec.policies import LFUEviction
from sampan.rec.table import HashEmbeddingTable


def _rss() -> int:
    """Resident set size in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_ten_million_distinct_ids_keep_memory_bounded_and_training_running():
    cap, batch, total = 10**6, 100_000, 10**7
    table = HashEmbeddingTable(16, eviction=LFUEviction(capacity=cap, slack=0.1))
    opt = SparseAdagrad(0.05)
    hot = np.arange(1000, dtype=np.int64)  # a stable head that should survive eviction
    rng = np.random.default_rng(0)
    rss, nbytes = [], []
    t0 = time.perf_counter()
    for step, start in enumerate(range(0, total, batch)):
        ids = np.concatenate([hot, np.arange(start, start + batch, dtype=np.int64) + 10**9])
        vecs = table.lookup(ids, step=step)
        assert np.isfinite(vecs).all()
        opt.apply(table, ids, rng.standard_normal(vecs.shape).astype(np.float32) * 0.1, step)
        assert len(table) <= cap + ids.size
        if step >= 20:
            rss.append(_rss())
            nbytes.append(table.nbytes)
    elapsed = time.perf_counter() - t0
    # after the table reached its cap, neither its own bytes nor the process RSS keep growing
    assert max(nbytes) == min(nbytes), (min(nbytes), max(nbytes))
    assert rss[-1] - rss[0] < 64 * 2**20, (rss[0] / 2**20, rss[-1] / 2**20)
    assert table.nbytes < 400 * 2**20
    assert (table.rows_for(hot, create=False) >= 0).all()
    print(f"10^7 ids in {elapsed:.1f}s, table {table.nbytes / 2**20:.0f} MiB, "
          f"RSS {rss[-1] / 2**20:.0f} MiB")
