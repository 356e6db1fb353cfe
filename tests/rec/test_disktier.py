"""Disk tier: a spilled table trains bit for bit like the all-RAM one, stays under its
RAM budget, snapshots and restores across both tiers, and survives a SIGKILLed writer."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from sampan.rec.disktier import DiskTierError, SpillStore
from sampan.rec.optim import SparseAdagrad
from sampan.rec.snapshot import export_delta, export_full, restore, table_state
from sampan.rec.table import HashEmbeddingTable

# the table tests run over the default store (sampan.rec.logstore); the SpillStore
# tests over LMDB, which stays selectable (disktier.STORE = "lmdb")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUDGET_MB = 0.5  # one 1024-row chunk of weights + Adagrad slots, beside map and metadata


def _pair(tmp_path, row_dtype="float32"):
    kw = dict(chunk_shift=10, row_dtype=row_dtype)
    ram = HashEmbeddingTable(16, **kw)
    disk = HashEmbeddingTable(16, memory_budget_mb=BUDGET_MB,
                              spill_dir=str(tmp_path / "spill"), **kw)
    return ram, disk


def _train(tables, steps, start=0, seed=0):
    rng = np.random.default_rng(seed)
    opts = [SparseAdagrad(0.1) for _ in tables]
    first = None
    for step in range(start, start + steps):
        ids = (rng.zipf(1.2, 400) % 20000) * 7919 - 3
        first = ids if first is None else first
        labels = rng.integers(0, 2, ids.size)
        for t, o in zip(tables, opts):
            v = t.lookup(ids, step=step)
            o.apply(t, ids, v * 0.5 + 0.01, step=step)
            t.record(first, labels)  # the first batch's ids: by now partly on disk
            if t.tier is not None:
                assert t.tier.resident_bytes <= t.tier.budget


def _same(a, b):
    sa, sb = table_state(a), table_state(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), k


@pytest.mark.parametrize("row_dtype", ["float32", "int8"])
def test_spilled_training_is_bit_identical_and_under_budget(tmp_path, row_dtype):
    ram, disk = _pair(tmp_path, row_dtype)
    _train([ram, disk], 30)
    assert disk.tier.demoted > 0 and disk.tier.promoted > 0 and len(disk.tier.store) > 0
    assert len(disk.map) <= disk.tier.max_rows < len(ram)
    assert len(disk) == len(ram) and np.array_equal(np.sort(disk.ids()), np.sort(ram.ids()))
    _same(ram, disk)
    ids = ram.ids()[:3000]
    np.testing.assert_array_equal(disk.read(ids), ram.read(ids))


def test_lmdb_store_stays_selectable(tmp_path, monkeypatch):
    pytest.importorskip("lmdb")
    from sampan.rec import disktier
    monkeypatch.setattr(disktier, "STORE", "lmdb")
    ram, disk = _pair(tmp_path)
    assert isinstance(disk.tier.store, SpillStore)
    _train([ram, disk], 12)
    assert disk.tier.demoted > 0 and disk.tier.promoted > 0
    _same(ram, disk)


def test_snapshot_and_delta_round_trip_across_tiers(tmp_path):
    ram, disk = _pair(tmp_path)
    _train([ram, disk], 20)
    export_full(disk, str(tmp_path / "f"))
    _train([ram, disk], 8, start=20, seed=1)
    assert disk.remove(disk.tier.ids()[:5]) == 5  # removals of disk rows reach the delta
    export_delta(disk, str(tmp_path / "d1"))
    back_disk = restore(str(tmp_path / "f"), [str(tmp_path / "d1")],
                        memory_budget_mb=BUDGET_MB, spill_dir=str(tmp_path / "s2"))
    back_ram = restore(str(tmp_path / "f"), [str(tmp_path / "d1")])
    assert back_disk.tier.resident_bytes <= back_disk.tier.budget
    assert len(back_disk.tier.store) > 0
    _same(back_disk, disk)
    _same(back_ram, disk)
    # the restored tiered table goes on training like the live one
    _train([disk, back_disk], 5, start=28, seed=2)
    _same(back_disk, disk)


def test_reopened_store_serves_its_rows_and_refuses_another_shape(tmp_path):
    ram, disk = _pair(tmp_path)
    _train([ram, disk], 10)
    on_disk = disk.tier.ids()
    want = disk.read(on_disk[:100])
    disk.tier.store.close()
    again = HashEmbeddingTable(16, chunk_shift=10, memory_budget_mb=BUDGET_MB,
                               spill_dir=str(tmp_path / "spill"))
    # every id demoted at least once is there, as of its last demotion
    assert len(again.tier.store) >= on_disk.size
    np.testing.assert_array_equal(again.read(on_disk[:100]), want)
    again.tier.store.close()
    with pytest.raises(DiskTierError, match="dim=16"):
        HashEmbeddingTable(8, memory_budget_mb=BUDGET_MB, spill_dir=str(tmp_path / "spill"))


def test_flipped_byte_in_a_record_is_refused(tmp_path):
    pytest.importorskip("lmdb")
    s = SpillStore(str(tmp_path / "s"), 4, "float32", "x")
    ids = np.arange(50, dtype=np.int64)
    rec = {"meta": np.zeros((50, 6), np.int64), "flags": np.zeros((50, 8), np.uint8),
           "values": np.full((50, 4), 1.5, np.float32)}
    s.put(ids, rec)
    s.close()
    path = tmp_path / "s" / "data.mdb"
    data = bytearray(path.read_bytes())
    pat = np.float32(1.5).tobytes() * 4
    pos = data.find(pat)
    while pos >= 0:  # copy-on-write leaves older page copies: damage every copy
        data[pos] ^= 0x40
        pos = data.find(pat, pos + 1)
    path.write_bytes(bytes(data))
    s = SpillStore(str(tmp_path / "s"), 4, "float32", "x")
    with pytest.raises(DiskTierError, match="checksum"):
        s.take(ids, delete=False)


_WRITER = """
import sys, numpy as np
from sampan.rec.disktier import SpillStore
s = SpillStore(sys.argv[1], 16, "float32", "w")
B = 1000  # <= SpillStore.SLICE: one transaction a batch
for k in range(10**6):
    ids = np.arange(k * B, (k + 1) * B, dtype=np.int64)
    rec = {"meta": np.full((B, 6), k, np.int64), "flags": np.zeros((B, 8), np.uint8),
           "values": np.full((B, 16), k, np.float32), "slots": np.full((B, 16), k, np.float32)}
    s.put(ids, rec)
    print(k, flush=True)
"""


def test_sigkilled_writer_leaves_whole_batches(tmp_path):
    pytest.importorskip("lmdb")
    path = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), path], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(5):  # a few committed batches, then kill in the middle of more
            assert p.stdout.readline(), "writer died"
        time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(30)
        p.stdout.close()
    s = SpillStore(path, 16, "float32", "w")  # opens: header count == rows held
    n = len(s)
    assert n > 0 and n % 1000 == 0
    for ids, rec in s.scan():  # every record checks; a batch is all there or absent
        assert np.array_equal(rec["meta"][:, 0], ids // 1000)
        assert np.array_equal(rec["values"][:, 0], (ids // 1000).astype(np.float32))
    seen = np.concatenate([i for i, _ in s.scan()])
    assert np.array_equal(np.sort(seen), np.arange(n))


_RSS = """
import sys, numpy as np
from sampan.rec.table import HashEmbeddingTable
from sampan.rec.optim import SparseAdagrad
def anon():
    return [int(l.split()[1]) for l in open("/proc/self/status")
            if l.startswith("RssAnon")][0] * 1024
t = HashEmbeddingTable(16, memory_budget_mb=8, spill_dir=sys.argv[1])
o = SparseAdagrad(0.1)
ids = np.arange(4096, dtype=np.int64)
o.apply(t, ids, t.lookup(ids, step=0))  # compile and size everything once
base = anon() - t.tier.resident_bytes
peak = 0
for step in range(1, 80):
    ids = np.arange(step * 4096, (step + 1) * 4096, dtype=np.int64)
    o.apply(t, ids, t.lookup(ids, step=step) * 0.1, step=step)
    peak = max(peak, anon() - base)
print(peak, t.tier.budget, len(t), len(t.map))
"""


def test_rss_stays_near_the_budget_in_a_subprocess(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_RSS), str(tmp_path / "s")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    peak, budget, n, resident = map(int, out.stdout.split())
    assert n == 80 * 4096 and resident < n
    # 330k rows of 51 stored bytes, 64 slot bytes and map would take ~45 MB all in RAM
    assert peak <= budget + 16 * 2**20, (peak, budget)


def test_pins_that_fill_the_budget_are_a_clear_error(tmp_path):
    t = HashEmbeddingTable(4, chunk_shift=6, memory_budget_mb=0.5,
                           spill_dir=str(tmp_path / "s"))
    ids = np.arange(t.tier.max_rows, dtype=np.int64)
    t.lookup(ids)
    t.pin(ids)
    with pytest.raises(ValueError, match="pinned"):
        t.lookup(ids + 10**6)
    t.unpin(ids)
    t.lookup(ids + 10**6)  # unpinned: demoted, and back on access
    np.testing.assert_array_equal(t.read(ids[:5]), t.lookup(ids[:5]))


_TRAINER = """
import sys, numpy as np
from sampan.rec.table import HashEmbeddingTable
from sampan.rec.optim import SparseAdagrad
t = HashEmbeddingTable(16, chunk_shift=10, memory_budget_mb=0.5, spill_dir=sys.argv[1])
o = SparseAdagrad(0.1)
rng = np.random.default_rng(0)
for step in range(10**6):
    ids = rng.integers(0, 20000, 512)
    o.apply(t, ids, t.lookup(ids, step=step), step=step)
    print(step, flush=True)
"""


def test_sigkilled_trainer_leaves_a_store_that_reopens(tmp_path):
    path = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_TRAINER), path], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(8):
            assert p.stdout.readline(), "trainer died"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(30)
        p.stdout.close()
    t = HashEmbeddingTable(16, chunk_shift=10, memory_budget_mb=0.5, spill_dir=path)
    n = sum(ids.size for ids, _ in t.tier.store.scan())  # every record's crc32 checks
    assert n == len(t.tier.store) == len(t) > 0
    ids = t.tier.ids()[:50]
    assert np.isfinite(t.lookup(ids)).all() and np.abs(t.read(ids)).max() > 0


def test_dynamic_widths_with_a_disk_tier_are_refused(tmp_path):
    """The disk tier stores fixed-width rows: the combination is refused, not half-served."""
    from sampan.rec.table import HashEmbeddingTable
    with pytest.raises(ValueError, match="dynamic_dims with a disk tier"):
        HashEmbeddingTable(16, dynamic_dims=(4, 16), dim_thresholds=(3,),
                           memory_budget_mb=8, spill_dir=str(tmp_path / "spill"))


def _hot_then_cold(tmp_path, cold_steps):
    """64 ids seen 20 times, then ``cold_steps`` batches of 256 new ids seen once: a
    spilled table and the all-RAM one, fed alike."""
    ram, disk = _pair(tmp_path)
    hot = np.arange(64, dtype=np.int64) * 31 + 5
    for step in range(20):
        for t in (ram, disk):
            t.lookup(hot, step=step)
    for k in range(cold_steps):
        cold = 10**6 + k * 256 + np.arange(256, dtype=np.int64)
        for t in (ram, disk):
            t.lookup(cold, step=20 + k)
    return ram, disk, hot


def test_frequent_rows_stay_resident_past_a_stream_of_new_ids(tmp_path):
    ram, disk, hot = _hot_then_cold(tmp_path, 48)  # ~12k new ids through ~2k rows of RAM
    assert disk.tier.demoted > 4 * disk.tier.max_rows
    assert (disk.map.get(hot) >= 0).all()  # least recently seen, but seen most
    ids = np.concatenate([hot, 10**6 + np.arange(48 * 256, dtype=np.int64)])
    assert np.array_equal(disk.read(ids), ram.read(ids))  # the demoted ones read from disk
    _same(ram, disk)


def test_frequency_ages_so_rows_hot_long_ago_leave(tmp_path, monkeypatch):
    from sampan.rec.disktier import DiskTier
    monkeypatch.setattr(DiskTier, "AGE", 2)  # 20 sightings halve to 0 after 10 steps unseen
    ram, disk, hot = _hot_then_cold(tmp_path, 24)
    assert (disk.map.get(hot) < 0).all()
    assert np.array_equal(disk.read(hot), ram.read(hot))
    _same(ram, disk)
