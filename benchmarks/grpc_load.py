"""S1's gRPC point: the same model of the same `sampan serve` process driven over gRPC
(KServe v2 / Triton ``ModelInfer`` with raw contents, as tritonclient.grpc sends) and over
HTTP (binary tensors, benchmarks/http_load.py), block by block in rotating order, at one
concurrency (64 by default), HTTP both with binary tensors and with JSON bodies. Lines:
requests/s, p50/p99, requests per batch and the server's and client's CPU per answered
request of each, then the ratios gRPC / HTTP-binary and gRPC / HTTP-JSON requests/s
(median of the per-block ratios) against the target (>= 1.2x).

The gRPC client is grpc.aio on one channel (HTTP/2 multiplexes the concurrent calls)
sending the request's serialized bytes built once, so the client does no protobuf work a
call; the HTTP client is the bare asyncio Protocol of http_load.py. Both share the
machine's cores with the server, so the client's CPU per request is printed beside the
server's: on a loaded 2-core machine it says which side limits the number.

    python benchmarks/serving.py --quick        # runs this point too (--no-grpc: not)
"""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def infer_request(model, inputs) -> bytes:
    """A serialized ModelInferRequest with raw inputs ({name: (datatype, array)})."""
    from sampan.serving.proto import inference_pb2 as pb
    req = pb.ModelInferRequest(model_name=model)
    for name, (dt, a) in inputs.items():
        req.inputs.add(name=name, datatype=dt, shape=a.shape)
        req.raw_input_contents.append(np.ascontiguousarray(a).tobytes())
    return req.SerializeToString()


async def drive_grpc(address, body, concurrency, requests, seconds, timeout=30.0):
    """`concurrency` callers sending `body` until `requests` are sent or `seconds` pass;
    returns (latencies_s of the OK calls, {status: count}, wall_s) as http_load's."""
    import grpc
    lat, codes = [], {}
    state = {"left": requests}
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(METHOD)           # bytes in, bytes out
        await call(body, timeout=timeout)       # connected before the clock starts
        t0 = time.perf_counter()
        t_end = t0 + seconds

        async def caller():
            while state["left"] > 0 and time.perf_counter() < t_end:
                state["left"] -= 1
                t = time.perf_counter()
                try:
                    await call(body, timeout=timeout)
                except grpc.aio.AioRpcError as e:
                    k = e.code().name
                    codes[k] = codes.get(k, 0) + 1
                    continue
                lat.append(time.perf_counter() - t)
                codes[200] = codes.get(200, 0) + 1
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return lat, codes, time.perf_counter() - t0


def grpc_vs_http(server, model, x, args, info, conc=64, target=1.2):
    """The point described in the module doc; `server` is serving.py's ServerProcess
    (started with --grpc-port 0). Returns the ratio line."""
    from http_load import _run_client, block_stats, drive_raw
    from serving import _client_cpu, batch_counts, binary_body
    bodies = {"http_binary": binary_body({"x": ("FP32", x)}),
              "http_json": json_body({"x": ("FP32", x)})}
    body_g = infer_request(model, {"x": ("FP32", x)})
    n, secs = max(1, args.requests // args.blocks), args.seconds / args.blocks

    def run(front):
        if front == "grpc":
            return asyncio.run(drive_grpc(server.grpc, body_g, conc, n, secs))
        return _run_client(drive_raw(server.url, model, *bodies[front], conc, n, secs))
    fronts = ("http_binary", "http_json", "grpc")
    for front in fronts:                       # warm-up: connections, executors
        run(front)
    blocks = {f: [] for f in fronts}
    for b in range(args.blocks):
        k = b % len(fronts)
        for front in fronts[k:] + fronts[:k]:
            s0, c0, m0 = server.cpu_s(), _client_cpu(), batch_counts(server.url)
            lat, codes, wall = run(front)
            ok = codes.get(200, 0)
            m1 = batch_counts(server.url)
            blocks[front].append({"rps": ok / wall, "lat": lat, "codes": codes, "ok": ok,
                                  "server_cpu": server.cpu_s() - s0,
                                  "client_cpu": _client_cpu() - c0,
                                  "batches": [a - b for a, b in zip(m1.get(model, (0, 0)),
                                                                    m0.get(model, (0, 0)))]})
    out = {}
    for front, bl in blocks.items():
        rec = {"workload": "S1", "system": "sampan_serve", "mode": f"{front}_batching_on",
               "model": model, "concurrency": conc, **block_stats(bl),
               "requests_per_batch": round(sum(x["batches"][1] for x in bl)
                                           / max(sum(x["batches"][0] for x in bl), 1), 2),
               "client": "grpc.aio" if front == "grpc" else "raw", **info}
        print(json.dumps(rec), flush=True)
        out[front] = rec
    lines = []
    for http in ("http_binary", "http_json"):
        # block by block (the same moment of the machine), then the median
        r = float(np.median([g["rps"] / max(h["rps"], 1e-9)
                             for g, h in zip(blocks["grpc"], blocks[http])]))
        line = {"workload": "S1", "system": "sampan_serve", "mode": f"grpc/{http}",
                "metric": "throughput_ratio", "model": model, "concurrency": conc,
                "value": round(r, 3), "target": target, "target_met": r >= target,
                "server_cpu_per_request_ratio": round(
                    out[http]["server_cpu_us_per_request"]
                    / max(out["grpc"]["server_cpu_us_per_request"], 1e-9), 3)}
        print(json.dumps(line), flush=True)
        lines.append(line)
    return lines


def json_body(inputs):
    """An all-JSON infer request (JSON outputs) and its length: sent with
    Inference-Header-Content-Length equal to the body's length (no binary part)."""
    b = json.dumps({"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                                "data": a.ravel().tolist()}
                               for n, (dt, a) in inputs.items()]}).encode()
    return b, len(b)
