"""An online-update scenario for a served DLRM, shared by the direct and the HTTP tests.

A small DLRM trains while requests stream in; after each few steps a delta export lands
in the watched directory. Before each export the expected answer of every request at
that snapshot is computed from the live table and the dense weights saved with the
model, in float64 numpy (an independent reference: no sampan op runs in it). The
scenario also drops a corrupt and a stale delta (both refused) and an out-of-order one
(held until its predecessor arrives) into the directory.
"""
from __future__ import annotations

import os
import shutil
import threading
import time

import numpy as np

import sampan
from sampan.rec.data import ClickStream
from sampan.rec.models import DLRM, train_step
from sampan.rec.snapshot import export_delta

F, D, DIM = 4, 3, 4
N_REQ, ROWS = 12, 3            # requests, rows each
ATOL = 2e-6                    # float32 server vs float64 reference, probabilities


def _linears(seq):
    return [(m.weight.numpy().astype(np.float64).copy(), m.bias.numpy().astype(np.float64).copy())
            for m in seq if hasattr(m, "weight")]


def _mlp(x, layers, last_relu):
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if last_relu or i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x


class Scenario:
    """Train, export into ``<model_dir>/deltas``, and know every request's answer at each
    exported sequence number (``expected[seq]``: (N_REQ, ROWS) probabilities)."""

    def __init__(self, root: str, max_batch_size: int = 16):
        from sampan.serving.rec import export_dlrm
        sampan.manual_seed(0)
        self.model = DLRM(n_fields=F, n_dense=D, dim=DIM, bottom=(8, DIM), top=(8,), lr=0.2,
                          init_std=0.1)  # updates that move every request's answer
        self.opt = sampan.optim.Adagrad(self.model.parameters(), lr=0.05)
        self.stream = ClickStream(seed=3, n_fields=F, n_dense=D)
        rng = np.random.default_rng(7)
        ranks = rng.choice(10**6, size=(N_REQ * ROWS, F), replace=False) + 10
        self.req_ids = self.stream.raw_ids(ranks).reshape(N_REQ, ROWS, F)
        self.req_dense = rng.standard_normal((N_REQ, ROWS, D)).astype(np.float32)
        self.i = 0
        self.train(3)
        self.dir = os.path.join(root, "ctr")
        export_dlrm(self.model, self.dir, max_batch_size=max_batch_size, poll_interval_ms=10,
                    dynamic_batching={"max_queue_delay_us": 2000, "max_queue_size": 256,
                                      "timeout_ms": 20000},
                    instance_count=2)
        self.deltas = os.path.join(self.dir, "deltas")
        self.bottom = _linears(self.model.bottom)   # the dense weights the server holds
        self.top = _linears(self.model.top)
        self.table = self.model.embedding.emb.shards[0].table
        self.expected = {0: self.reference()}

    def train(self, steps: int) -> None:
        """Steps on click-stream batches that also hold every request row, so each
        export changes every request's answer."""
        ids = self.req_ids.reshape(-1, F)
        dense = self.req_dense.reshape(-1, D)
        for _ in range(steps):
            b = self.stream.batch(self.i, 64)
            self.i += 1
            labels = np.concatenate([b.labels, (np.arange(len(ids)) + self.i) % 2]).astype(
                np.float32)
            train_step(self.model, self.opt, np.concatenate([b.ids_matrix(), ids]),
                       np.concatenate([b.dense, dense]), labels)

    def reference(self) -> np.ndarray:
        """Float64 answers of every request from the live table (= the next export)."""
        ids = self.req_ids.reshape(-1, F)
        emb = self.table.read(ids.ravel()).reshape(len(ids), F, DIM).astype(np.float64)
        x = _mlp(self.req_dense.reshape(-1, D).astype(np.float64), self.bottom, True)
        t = np.concatenate([x[:, None], emb], axis=1)
        iu = np.triu_indices(F + 1, 1)
        pairs = np.einsum("bid,bjd->bij", t, t)[:, iu[0], iu[1]]
        z = _mlp(np.concatenate([x, pairs], axis=1), self.top, False)[:, 0]
        return (1 / (1 + np.exp(-z))).reshape(N_REQ, ROWS)

    def export(self, path: str | None = None) -> int:
        """Compute the next snapshot's answers, then export it (into the watched
        directory unless `path` says otherwise); returns its sequence number."""
        seq = self.table.export_seq + 1
        self.expected[seq] = self.reference()
        export_delta(self.table, path or os.path.join(self.deltas, f"{seq:06d}.delta"))
        return seq

    def drop(self, name: str, data: bytes) -> None:
        """Place a file in the watched directory atomically (as an exporter would)."""
        tmp = os.path.join(self.deltas, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.deltas, name))

    def matching(self, req: int, answer: np.ndarray) -> set:
        """The sequence numbers whose every row equals `answer` (one request)."""
        a = np.asarray(answer, np.float64).reshape(ROWS)
        return {s for s, e in self.expected.items()
                if np.allclose(a, e[req], rtol=0, atol=ATOL)}


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def wait_for(cond, what: str, timeout: float = 15.0):
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def run(sc: Scenario, send, metadata, n_clients: int = 4, n_deltas: int = 5) -> dict:
    """Stream requests from `n_clients` threads (``send(req) -> (ROWS,) probabilities``)
    while training and exporting; check every answer and the refusals; returns counts."""
    answers, errors, stop = [], [], threading.Event()

    def client(k):
        rng = np.random.default_rng(k)
        while not stop.is_set():
            r = int(rng.integers(N_REQ))
            try:
                answers.append((r, np.asarray(send(r))))
            except Exception as e:  # noqa: BLE001 -- every failure is reported below
                errors.append(repr(e))

    seqs_seen = [metadata()["snapshot_sequence"]]

    def served(seq):
        m = metadata()
        seqs_seen.append(m["snapshot_sequence"])
        return m if m["snapshot_sequence"] == seq else None

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(answers) >= 5, "first answers")
        refused = 0
        for k in range(1, n_deltas + 1):
            sc.train(2)
            seq = sc.export()
            n0 = len(answers)
            wait_for(lambda q=seq: served(q), f"the server to serve export {seq}")
            wait_for(lambda n=n0: len(answers) >= n + 3, f"answers at export {seq}")
            if k == 2:   # a flipped byte: the checksum catches it
                data = bytearray(_read(os.path.join(sc.deltas, "000001.delta")))
                data[len(data) // 2] ^= 0x40
                sc.drop("corrupt.delta", bytes(data))
                refused += 1
                m = wait_for(lambda n=refused: metadata()["refused_deltas"] == n and metadata(),
                             "the corrupt delta refused")
                assert m["last_refused"]["file"] == "corrupt.delta"
                assert "checksum" in m["last_refused"]["reason"], m["last_refused"]
                assert m["snapshot_sequence"] == seq
            if k == 3:   # an old delta again
                sc.drop("stale.delta", _read(os.path.join(sc.deltas, "000002.delta")))
                refused += 1
                m = wait_for(lambda n=refused: metadata()["refused_deltas"] == n and metadata(),
                             "the stale delta refused")
                assert "stale" in m["last_refused"]["reason"], m["last_refused"]
        # out of order: export n+1 elsewhere, n+2 into the directory; then bring n+1
        last = sc.table.export_seq
        held = os.path.join(os.path.dirname(sc.dir), f"{last + 1:06d}.delta")
        sc.train(2)
        sc.export(held)
        sc.train(1)
        sc.export()
        m = wait_for(lambda: metadata()["held_deltas"] == 1 and metadata(),
                     "the out-of-order delta held")
        assert m["snapshot_sequence"] == last and m["refused_deltas"] == refused
        n0 = len(answers)
        wait_for(lambda: len(answers) >= n0 + 3, "answers while a delta is held")
        shutil.move(held, os.path.join(sc.deltas, os.path.basename(held)))
        wait_for(lambda: served(last + 2), "the missing delta and the held one applied")
        assert metadata()["refused_deltas"] == refused
        assert metadata()["held_deltas"] == 0
        n0 = len(answers)
        wait_for(lambda: len(answers) >= n0 + 3, "answers after the held delta")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    assert seqs_seen == sorted(seqs_seen), "the served sequence went backwards"
    # every request's answer at one snapshot differs from its answer at any other, so
    # an answer matches at most one; one computed from two snapshots (some rows or
    # fields from each) matches none, unless its numbers are those of one of them
    for s in sc.expected:
        for q in sc.expected:
            if s < q:
                gap = np.abs(sc.expected[s] - sc.expected[q]).max(1).min()
                assert gap > 20 * ATOL, (s, q, gap)
    by_seq: dict = {}
    for r, a in answers:
        m = sc.matching(r, a)
        assert len(m) == 1, f"request {r}: answer {a} matches snapshots {m}"
        (s,) = m
        by_seq[s] = by_seq.get(s, 0) + 1
    assert last + 2 in by_seq, "the held delta was never served"
    assert len(by_seq) >= 3, by_seq
    return {"answers": len(answers), "by_seq": by_seq, "refused": refused}
