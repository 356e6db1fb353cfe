"""T1 dynamic embedding dimension on the W4 stream: AUC and embedding bytes per row of
rows 4 -> 8 -> 16 wide by sighting count against fixed float32 16-wide rows.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python \
        benchmarks/embedding_dynwidth.py [--steps 200 --batch 2048 --cuts 4,32]

Both systems train the same W4 DLRM (``w4_ctr.shared_weights``) on the same batches;
the line reports each one's AUC on held-out batches and the weights' bytes per row
(dynamic: the mean over rows of 4 bytes per stored lane, plus 5 bytes of per-row index;
``bytes_per_row`` also shows the optimiser slots, kept full width, and the metadata),
then the bytes cut and the AUC difference (target: cut >= 2 with the dynamic rows'
AUC at most 0.003 below the fixed rows'; a higher AUC is reported, not penalised).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from common import blas_info, emit
from embedding_tiers import DIM, _model, _train

from sampan.rec.data import ClickStream
from sampan.rec.metrics import auc
from sampan.rec.models import predict


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=10)
    ap.add_argument("--dims", default="4,8,16", help="widths, ending at 16")
    ap.add_argument("--cuts", default="4,32", help="sighting counts that widen a row")
    ap.add_argument("--quick", action="store_true", help="60 steps of 1024, 4 eval batches")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.eval_batches = 60, 1024, 4
    dims = tuple(int(x) for x in args.dims.split(","))
    cuts = tuple(int(x) for x in args.cuts.split(","))
    from threadpoolctl import threadpool_limits
    from w4_ctr import shared_weights
    threadpool_limits(1)
    stream = ClickStream(seed=0)
    info = {"batch": args.batch, "steps": args.steps, **blas_info()}
    print(f"# generating {args.steps} + {args.eval_batches} batches", file=sys.stderr,
          flush=True)
    train = [stream.batch(i, args.batch) for i in range(args.steps)]
    evals = [stream.batch(10**6 + i, args.batch) for i in range(args.eval_batches)]
    labels = np.concatenate([b.labels for b in evals])
    weights = shared_weights()
    blocks = np.array_split(np.arange(len(train)), 5)
    res = {}
    for name, kw in (("fixed", {}), ("dynamic", {"dynamic_dims": dims,
                                                 "dim_thresholds": cuts})):
        m, opt = _model(weights, **kw)
        ts = list(_train(m, opt, train, blocks))
        a = auc(np.concatenate([predict(m, b.ids_matrix(), b.dense) for b in evals]),
                labels)
        t = m.embedding.emb.shards[0].table
        bpr = t.bytes_per_row["weights"]
        widths = t.weights.width_counts() if kw else {DIM: len(t)}
        rates = [len(b) * args.batch / s for b, s in zip(blocks, ts)]
        res[name] = emit("T1", "sampan", f"dynwidth-{name}", "auc", [a],
                         weight_bytes_per_row=bpr, bytes_per_row=t.bytes_per_row,
                         rows=len(t),
                         weight_mb=round(len(t) * bpr / 2**20, 1),
                         widths={str(k): v for k, v in widths.items()},
                         samples_per_s=round(float(np.median(rates)), 1),
                         **({"dims": list(dims), "cuts": list(cuts)} if kw else {}), **info)
        m.embedding.emb.close()
    cut = res["fixed"]["weight_bytes_per_row"] / res["dynamic"]["weight_bytes_per_row"]
    delta = res["dynamic"]["value"] - res["fixed"]["value"]
    # the target bounds what the narrow rows may cost: an AUC above the fixed rows' is
    # no loss (reported signed, as auc_delta)
    loss = max(0.0, -delta)
    emit("T1", "sampan_dynwidth/sampan_float32", "dynwidth", "bytes_cut", [cut],
         auc_delta=round(delta, 4), auc_loss=round(loss, 4), target_cut=2.0,
         target_auc_loss=0.003, met=bool(cut >= 2.0 and loss <= 0.003))


if __name__ == "__main__":
    main()
