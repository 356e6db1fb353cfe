"""Feature-spec throughput: sampan's compiled FeatureSpec (numba kernels over CSR) against
the same transforms written with pyarrow.compute (numpy where pyarrow has no kernel:
pyarrow has no string hash, searchsorted or padded scatter). pandas is not installed in
the venv, so pyarrow.compute is the one peer.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/feature_spec.py
    ... --rows 20000 --reps 3          (quick look)

The raw table is W4-shaped: 8 categorical string fields and 4 integer fields (Zipf(1.1)
ranks), 4 float fields with 10% NaN, one list<int> history of 0-20 ids a row. The spec
hashes every categorical field (2^20 buckets), bucketizes the floats (16 boundaries),
crosses 4 pairs of fields, keeps the last 10 ids of the history hashed, and passes the
floats as dense features. The peer hashes each distinct string once (dictionary_encode
first: the fast way to write it), and both sides' outputs are checked equal before
timing. One JSON line: rows/s of each system (median of --reps, min-max) and the ratio
(the median of per-rep ratios: the two systems run in turn, a rep each).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from common import emit, timeit

from sampan.rec.data import zipf_ranks
from sampan.rec.features import FeatureSpec

N_STR, N_INT, N_FLOAT, HIST = 8, 4, 4, 10
BUCKETS = 1 << 20
BOUNDS = [float(b) for b in np.linspace(-2, 2, 16)]
CROSSES = [("s0", "s1"), ("s2", "s3"), ("s0", "i0"), ("s4", "i1")]


def raw_table(rows: int, seed: int = 0):
    """The raw W4-shaped table, one chunk a column."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    cols = {}
    for f in range(N_STR):
        ranks = zipf_ranks(rng, rows, n=10**6)
        uniq, inv = np.unique(ranks, return_inverse=True)
        words = pa.array([f"f{f}-value-{r}" for r in uniq.tolist()])
        cols[f"s{f}"] = words.take(pa.array(inv))
    for f in range(N_INT):
        cols[f"i{f}"] = pa.array(zipf_ranks(rng, rows, n=10**7))
    for f in range(N_FLOAT):
        x = rng.standard_normal(rows)
        x[rng.random(rows) < 0.1] = np.nan
        cols[f"d{f}"] = pa.array(x)
    lens = rng.integers(0, 21, size=rows)
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cols["hist"] = pa.ListArray.from_arrays(pa.array(offs),
                                            pa.array(zipf_ranks(rng, int(offs[-1]), n=10**6)))
    return pa.table(cols)


def spec() -> FeatureSpec:
    inputs = {f"s{f}": "string" for f in range(N_STR)}
    inputs.update({f"i{f}": "int" for f in range(N_INT)})
    inputs.update({f"d{f}": "float" for f in range(N_FLOAT)})
    inputs["hist"] = "list<int>"
    feats = [{"name": f"h_{k}", "op": "hash", "input": k, "buckets": BUCKETS, "seed": j}
             for j, k in enumerate(inputs) if k[0] in "si"]
    feats += [{"name": f"b_d{f}", "op": "bucketize", "input": f"d{f}", "boundaries": BOUNDS}
              for f in range(N_FLOAT)]
    feats += [{"name": f"x_{a}_{b}", "op": "cross", "inputs": [a, b], "buckets": BUCKETS,
               "seed": 100 + j} for j, (a, b) in enumerate(CROSSES)]
    feats += [{"name": "hist_h", "op": "hash", "input": "hist", "seed": 99, "output": False},
              {"name": "hist_seq", "op": "sequence", "input": "hist_h", "length": HIST,
               "keep": "last", "pad": 0}]
    feats += [{"name": f"v_d{f}", "op": "dense", "input": f"d{f}"} for f in range(N_FLOAT)]
    return FeatureSpec(inputs, feats)


# ---------------------------------------------------------------- the pyarrow.compute peer
def _u64(v):
    import pyarrow as pa
    return pa.scalar(int(v), pa.uint64())


def _mix(pc, z):
    z = pc.bit_wise_xor(z, pc.shift_right(z, _u64(30)))
    z = pc.multiply(z, _u64(0xBF58476D1CE4E5B9))  # wraps modulo 2^64 (unchecked)
    z = pc.bit_wise_xor(z, pc.shift_right(z, _u64(27)))
    z = pc.multiply(z, _u64(0x94D049BB133111EB))
    return pc.bit_wise_xor(z, pc.shift_right(z, _u64(31)))


def _key(seed):
    from sampan.rec._feature_kernels import seed_key
    return int(seed_key(seed))


def _content_ints(pc, pa, arr):
    return arr.cast(pa.uint64(), safe=False)


def _content_strings(pc, pa, arr):
    """sampan-hash64's content of each distinct string, word by word with numpy, then
    taken back to the rows."""
    enc = pc.dictionary_encode(arr)
    words = enc.dictionary
    offs = np.frombuffer(words.buffers()[1], np.int32, count=words.offset + len(words) + 1)
    offs = offs[words.offset:].astype(np.int64)
    data = np.frombuffer(words.buffers()[2], np.uint8)
    lens = np.diff(offs)
    h = pa.array(np.full(lens.size, 0x9E3779B97F4A7C15, np.uint64))
    for k in range(int(-(-lens.max() // 8)) if lens.size else 0):
        w = np.zeros(lens.size, np.uint64)
        for b in range(8):
            pos = offs[:-1] + 8 * k + b
            ok = pos < offs[1:]
            w[ok] |= data[pos[ok]].astype(np.uint64) << np.uint64(8 * b)
        live = lens > 8 * k
        mixed = _mix(pc, pc.bit_wise_xor(h, pa.array(w))).to_numpy()
        h = pa.array(np.where(live, mixed, h.to_numpy()))
    h = _mix(pc, pc.bit_wise_xor(h, pa.array(lens.astype(np.uint64))))
    return h.take(enc.indices)


def _content(pc, pa, table, name, cache):
    if name not in cache:  # once a column, as sampan does
        col = table.column(name).chunk(0)
        cache[name] = (_content_strings(pc, pa, col) if name[0] == "s"
                       else _content_ints(pc, pa, col))
    return cache[name]


def _bucket(pc, pa, h, buckets):
    """h mod buckets (pyarrow.compute has no modulo: a mask for a power of two, as sampan
    does, else h - (h // b) * b on uint64)."""
    if buckets & (buckets - 1) == 0:
        return pc.cast(pc.bit_wise_and(h, _u64(buckets - 1)), pa.int64())
    b = _u64(buckets)
    return pc.cast(pc.subtract(h, pc.multiply(pc.divide(h, b), b)), pa.int64())


def peer(table):
    import pyarrow as pa
    import pyarrow.compute as pc

    out, cache = {}, {}
    for j, k in enumerate([c for c in table.column_names if c[0] in "si"]):
        h = _mix(pc, pc.bit_wise_xor(_content(pc, pa, table, k, cache), _u64(_key(j))))
        out[f"h_{k}"] = _bucket(pc, pa, h, BUCKETS)
    for f in range(N_FLOAT):
        x = table.column(f"d{f}").chunk(0)
        b = pc.cast(pc.greater_equal(x, BOUNDS[0]), pa.int64())
        for t in BOUNDS[1:]:
            b = pc.add(b, pc.cast(pc.greater_equal(x, t), pa.int64()))
        out[f"b_d{f}"] = pc.if_else(pc.is_nan(x), len(BOUNDS) + 1, b)
    for j, (a, b) in enumerate(CROSSES):
        h = _mix(pc, pc.bit_wise_xor(_content(pc, pa, table, a, cache), _u64(_key(100 + j))))
        h = _mix(pc, pc.bit_wise_xor(h, _content(pc, pa, table, b, cache)))
        out[f"x_{a}_{b}"] = _bucket(pc, pa, h, BUCKETS)
    hist = table.column("hist").chunk(0)
    hv = _mix(pc, pc.bit_wise_xor(_content_ints(pc, pa, hist.flatten()), _u64(_key(99))))
    hv = hv.cast(pa.int64(), safe=False)
    lens = pc.list_value_length(hist).to_numpy()
    parent = pc.list_parent_indices(hist).to_numpy()
    offs = hist.offsets.to_numpy()
    pos = np.arange(parent.size) - offs[parent]
    start = np.maximum(lens - HIST, 0)[parent]
    keep = pos >= start
    seq = np.zeros((len(hist), HIST), np.int64)
    seq[parent[keep], (pos - start)[keep]] = hv.to_numpy()[keep]
    out["hist_seq"] = seq
    for f in range(N_FLOAT):
        x = table.column(f"d{f}").chunk(0)
        out[f"v_d{f}"] = pc.if_else(pc.is_nan(x), 0.0, x).cast(pa.float32())
    return out


def check_equal(sp, table) -> None:
    got = sp.apply(table)
    ref = peer(table)
    for name, (_, v) in got.sparse.items():
        want = np.asarray(ref[name]).reshape(-1)
        if not np.array_equal(v, want):
            sys.exit(f"feature_spec: {name} differs between sampan and the peer")
    for name, v in got.dense.items():
        if not np.array_equal(v.ravel(), np.asarray(ref[name])):
            sys.exit(f"feature_spec: {name} differs between sampan and the peer")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"feature_spec: building a {a.rows}-row raw table", file=sys.stderr)
    table = raw_table(a.rows)
    sp = spec()
    check_equal(sp, table)  # also the warm-up of both
    print("feature_spec: outputs equal; timing", file=sys.stderr)
    t_s, t_p = [], []
    for _ in range(a.reps):  # in turn, so a shared machine's load falls on both alike
        t_s += timeit(lambda: sp.apply(table), reps=1, warmup=0)
        t_p += timeit(lambda: peer(table), reps=1, warmup=0)
    rs = [a.rows / t for t in t_s]
    rp = [a.rows / t for t in t_p]
    ratio = float(np.median([p / s for s, p in zip(t_s, t_p)]))
    emit("feature_spec", "sampan", "compiled", "rows_per_s", rs, rows=a.rows,
         peer="pyarrow.compute", peer_rows_per_s=round(float(np.median(rp)), 1),
         peer_min=round(min(rp), 1), peer_max=round(max(rp), 1), ratio=round(ratio, 2),
         n_sparse=len(sp.sparse_names), n_dense=len(sp.dense_names),
         pandas="not installed")


if __name__ == "__main__":
    main()
