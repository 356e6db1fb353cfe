"""S1 cost per request: what one JSON infer request of the W5 MLP (784 floats in, 10 out)
costs `sampan serve`, the whole path (HTTP, data plane, batcher, model) in this process,
sequential requests from a raw socket, for each JSON library (orjson, the standard
library) and with per-request logs off (the default) and on (``--log-requests``); also
the codec alone (decode + encode of the same body).

One line per configuration: CPU microseconds per request (process CPU time over the timed
requests, so the client's small share is in it too), median of `--reps` runs. On a busy
machine the times swell alike; the ratios between lines are what count, and instruction
counts do not depend on the load at all:

    python benchmarks/serving_cost.py [--requests 300] [--reps 3]
    valgrind --tool=callgrind python benchmarks/serving_cost.py --only orjson,off --requests 0
    valgrind --tool=callgrind python benchmarks/serving_cost.py --only orjson,off --requests 200
    # (total instructions of the second run - the first) / 200 = instructions a request
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time

if __name__ == "__main__":  # before numpy: OpenBLAS reads its overrides when it loads
    from _blas_env import rerun_without_overrides
    rerun_without_overrides()

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from common import machine_info  # noqa: E402


def _client(port, body):
    """A function sending one request on a kept-alive connection and reading its answer."""
    req = (f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: b\r\nContent-Type: "
           f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def one():
        c.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += c.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                 if ln.lower().startswith(b"content-length:"))
        while len(rest) < n:
            rest += c.recv(65536)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the server answered {head[:40]!r}: {rest[:200]!r}")
    return one, c


def _cpu_per_request(fn, n, reps):
    out = []
    for _ in range(reps):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        out.append(1e6 * (time.process_time() - t0) / max(n, 1))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="timed requests per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", help="one configuration, as BACKEND,LOGS (e.g. orjson,off)")
    args = ap.parse_args(argv)
    from serving import build_models

    from sampan.serving import Server, jsoncodec, protocol
    from sampan.serving.model import load_model
    info = machine_info()
    configs = [(b, lg) for b in ("orjson", "json") for lg in ("off", "on")]
    if args.only:
        configs = [tuple(args.only.split(","))]
    x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784],
                                   "data": x.ravel().tolist()}]}).encode()
    sink = open(os.devnull, "w")    # noqa: SIM115 -- the log writer thread's, until exit
    with tempfile.TemporaryDirectory(prefix="sampan-s1-cost-") as folder:
        repo, _ = build_models(folder, 500, lambda m: None)
        d = os.path.join(repo, "mlp_single")
        m = load_model("mlp", d)
        for backend, logs in configs:
            jsoncodec.set_backend(backend)
            res = {o.name: np.zeros((1, 10), np.float32) for o in m.outputs}

            def codec():
                protocol.encode(m, protocol.decode(m, body), res)
            s = Server({"mlp": d}, log_level="info", log_requests=logs == "on")
            saved, sys.stderr = sys.stderr, sink    # the log lines: written, not shown
            try:
                s.start()
            finally:
                sys.stderr = saved
            one, conn = _client(s.port, body)
            try:
                for _ in range(30):                 # warm: executors, connection
                    one()
                whole = _cpu_per_request(one, args.requests, args.reps)
            finally:
                conn.close()
                s.stop()
            alone = _cpu_per_request(codec, args.requests, args.reps)
            print(json.dumps({"workload": "S1", "system": "sampan_serve", "model": "mlp",
                              "mode": f"json={backend},log_requests={logs}",
                              "metric": "cpu_us_per_request",
                              "value": round(float(np.median(whole)), 1),
                              "min": round(min(whole), 1), "max": round(max(whole), 1),
                              "codec_cpu_us_per_request": round(float(np.median(alone)), 1),
                              "requests": args.requests, "reps": args.reps, **info}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
