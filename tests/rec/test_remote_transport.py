"""The Ray shard actor's transport and snapshot writer, driven in-process (no Ray): the
shared memory arena, batched calls, and snapshot files written off the call path."""

import threading

import numpy as np
import pytest

from sampan.rec import _server, _shm
from sampan.rec._server import IN_SLOT, ShardServer, _chain
from sampan.rec.optim import SparseAdagrad
from sampan.rec.sharded import LocalShard
from sampan.rec.snapshot import restore, table_state
from sampan.rec.table import HashEmbeddingTable

DIM = 4


def test_arena_slots_never_overlap_and_freed_space_comes_back():
    arena = _shm.Arena(64 + 64 * 40)
    rng = np.random.default_rng(0)
    live = {}  # offset -> (slot, fill value)
    refused = 0
    for i in range(600):
        if live and (rng.random() < 0.45 or len(live) > 30):
            off = list(live)[int(rng.integers(len(live)))]  # freed in any order
            slot, v = live.pop(off)
            assert (arena.view(slot) == v).all()  # nobody wrote over it
            arena.free(off)
            continue
        slot = arena.reserve(np.float32, (int(rng.integers(1, 48)),))
        if slot is None:
            refused += 1
            continue
        end = slot.offset + slot.nbytes
        assert 64 <= slot.offset and end <= arena.nbytes
        for other, _ in live.values():
            assert end <= other.offset or other.offset + other.nbytes <= slot.offset
        arena.view(slot)[...] = i
        live[slot.offset] = (slot, i)
    assert refused > 0  # it did fill up, and went on once space was freed
    for off in list(live):
        arena.free(off)
    assert arena.alloc(arena.nbytes - 64) == 64  # all of it is back
    arena.close()


_MADE = []


@pytest.fixture(autouse=True)
def _close_servers():
    yield
    while _MADE:                  # their snapshot writer threads end with them
        _MADE.pop().close()


def _server_and_local(tmp_path, arena=None, delta_every=2):
    srv = ShardServer(0, 1, DIM, SparseAdagrad(0.05), {}, str(tmp_path), delta_every,
                      arena=arena)
    _MADE.append(srv)
    return srv, LocalShard(HashEmbeddingTable(DIM), SparseAdagrad(0.05))


def _ids(k, n=300):
    return np.unique(np.random.default_rng(k).integers(0, 1000, n)).astype(np.int64)


def test_arena_calls_batched_calls_and_the_inline_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(_shm, "MIN_BYTES", 0)  # every array through the arena
    arena = _shm.Arena(1 << 20)
    srv, local = _server_and_local(tmp_path, arena.handle())
    assert srv.info()["arena"]
    ids = _ids(0)
    wire, slots, out = _shm.encode(arena, (ids, 0), (ids.size, DIM))
    assert isinstance(wire[0], _shm.Slot) and out is wire[-1]
    reply = srv.call("pull", 1, 0, *wire)
    assert reply[0] == "ok" and reply[1] == IN_SLOT
    np.testing.assert_array_equal(arena.view(out), local.pull(ids, 0))
    grads = np.random.default_rng(1).normal(size=(ids.size, DIM)).astype(np.float32)
    local.push(ids, grads, 0)
    # a push and the next pull in one call: answered in order, applied in order
    wire, _, _ = _shm.encode(arena, (ids, grads, 0))
    replies = srv.call_many([("push", 2, 1, wire), ("pull", 3, 2, (ids, 1))])
    assert [r[0] for r in replies] == ["ok", "ok"] and replies[1][2] == 3
    np.testing.assert_array_equal(replies[1][1], local.pull(ids, 1))
    # a call that raises answers its error; the next one still runs (and finds the gap)
    bad, after = srv.call_many([("pull", 4, 3, ("not ids", 2)), ("pull", 5, 4, (ids, 2))])
    assert bad[0] == "error" and after == ("gap", 3)
    for s in slots:
        arena.free(s.offset)
    # a shard that cannot reach the arena (another host) says so and applies nothing
    other, _ = _server_and_local(tmp_path / "b")
    assert other.call("pull", 1, 0, *_shm.encode(arena, (ids, 0))[0]) == ("inline", 0)
    assert other.info()["applied"] == 0
    assert _shm.attach((arena.handle()[0], arena.fd, arena.nbytes, b"x" * 16)) is None
    arena.close()


def test_snapshot_files_leave_the_call_and_a_failed_write_is_repaired(tmp_path, monkeypatch):
    srv, local = _server_and_local(tmp_path)
    write = _server._write_atomic
    gate, fail = threading.Event(), []

    def slow_or_failing(path, header, arrays):
        gate.wait(10)
        if fail:
            fail.pop()
            raise OSError("disk full")
        write(path, header, arrays)

    monkeypatch.setattr(_server, "_write_atomic", slow_or_failing)
    n = 0
    for k in range(6):  # deltas after pushes 2, 4 and 6
        ids = _ids(k)
        grads = np.full((ids.size, DIM), 0.1 * (k + 1), np.float32)
        n += 2
        assert srv.call("pull", n - 1, n - 2, ids, k)[0] == "ok"
        reply = srv.call("push", n, n - 1, ids, grads, k)
        local.pull(ids, k)
        local.push(ids, grads, k)
        if k == 1:  # the call answered while its delta is not on disk yet
            assert reply[3] == 0 and srv.info()["durable"] == 0
            fail.append(True)  # ... and that write fails
            gate.set()
            srv._writes.join()
            assert "disk full" in srv.info()["write_error"] and srv.info()["durable"] == 0
    srv._writes.join()
    info = srv.info()
    assert info["durable"] == info["applied"] == n
    # the export after the failure was a full one: the chain on disk is whole
    chain = _chain(str(tmp_path))
    assert chain[0][1] == "full" and chain[0][2] == 8 and [c[1] for c in chain[1:]] == ["delta"]
    got = table_state(restore(chain[0][3], [c[3] for c in chain[1:]]))
    want = table_state(local.table)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_close_stops_the_snapshot_writer(tmp_path):
    srv, _ = _server_and_local(tmp_path)
    assert srv._writer.is_alive()
    srv.close()
    srv.close()                   # twice is fine
    assert not srv._writer.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "shard-0-snapshots"]


def test_a_slot_outside_the_arena_is_refused():
    buf = np.zeros(1024, np.uint8)
    with pytest.raises(ValueError, match="outside"):
        _shm.view(buf, _shm.Slot(1000, "<f4", (100,)))
