"""`make bench`: run every workload script in this folder, each in its own process with the
OpenBLAS variables unset (the Makefile does that), printing JSON lines."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    only = set(argv)
    # every workload script (w*_*.py) plus the kernel-level comparisons
    scripts = sorted(glob.glob(os.path.join(HERE, "w*_*.py"))) + [
        os.path.join(HERE, n) for n in (
            "conv_micro.py",
            "fusion_kernels.py",
            "onnx_conformance.py",
            "onnx_models.py",
            "data_parallel.py",
            "thread_pools.py",
            "embedding_tiers.py",
            "embedding_disk.py",
            "embedding_dynwidth.py",
            "predictor_overhead.py",
            "feature_spec.py",
            "serving_peers.py",     # sampan serve vs MLServer and KServe (issue 32)
            "control_flow.py",
            "edge.py",
        )
        if os.path.exists(os.path.join(HERE, n))]
    # (script, arguments): the serving lines issue 32 asks of `make bench` besides the
    # peers': batching on/off with JSON bodies and gRPC vs HTTP on the MLP, batching
    # on/off with binary tensors on the MiniLM encoder
    runs = [(s, ()) for s in scripts] + [
        (os.path.join(HERE, "serving.py"), a) for a in (
            ("--body", "json", "--concurrency", "1", "16", "64", "--no-overload"),
            ("--model", "minilm", "--body", "binary", "--concurrency", "1", "16", "64"))] + [
        # issue 33's 10^8-id disk line (the default run above is 10^7, with all-RAM):
        # ~6 min of fill and ~33 GB in the temp folder on the 2-core Xeon
        (os.path.join(HERE, "embedding_disk.py"),
         ("--parts", "train", "--systems", "disk", "--ids", "100000000", "--steps", "1000"))]
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    rc = 0
    for s, extra in runs:
        name = os.path.basename(s)
        if only and not any(o.lower() in name for o in only):
            continue
        print(f"# {' '.join((name,) + tuple(extra))}", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, s, *extra], cwd=HERE, env=env)
        rc = rc or r.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
