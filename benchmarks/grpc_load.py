"""S1's gRPC point: the same model of the same `sampan serve` process driven over gRPC
(KServe v2 / Triton ``ModelInfer`` with raw contents, as tritonclient.grpc sends) and over
HTTP (binary tensors, benchmarks/http_load.py), block by block in rotating order, at one
concurrency (64 by default), HTTP both with binary tensors and with JSON bodies. Lines:
requests/s, p50/p99, requests per batch and the server's and client's CPU per answered
request of each, then the ratios gRPC / HTTP-binary and gRPC / HTTP-JSON requests/s
(median of the per-block ratios) against the target (>= 1.2x), one pair per gRPC client.

Two gRPC clients, each on one connection (HTTP/2 multiplexes the concurrent calls) and
sending the request's serialized bytes built once: grpc.aio (``grpc``), and a bare
HTTP/2 client (``grpc_h2``, `drive_h2`: prebuilt frames, the answer's trailers decoded by
the ``hpack`` package) of the same kind as the HTTP client, the bare asyncio Protocol of
http_load.py. All share the machine's cores with the server, so the client's CPU per
request is printed beside the server's: grpc.aio spends 50-75 us a call where the bare
clients spend 10-30, and on a loaded 2-core machine that alone decides its ratio. No
call carries a deadline unless ``--grpc-deadline`` is given (tritonclient.grpc sends none
by default; the HTTP requests carry none either).

    python benchmarks/serving.py --quick        # runs this point too (--no-grpc: not)
    python benchmarks/grpc_load.py [--quick] [--grpc-impl native grpcio]
                                   [--requests 20000 --blocks 20]   # this point alone,
                                                # one server process per --grpc-impl
"""
from __future__ import annotations

import asyncio
import json
import struct
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


async def drive_grpc(address, body, concurrency, requests, seconds, timeout=30.0,
                     deadline=None):
    """`concurrency` callers sending `body` until `requests` are sent or `seconds` pass;
    returns (latencies_s of the OK calls, {status: count}, wall_s) as http_load's.
    `deadline`: each call's gRPC timeout (None: none, as tritonclient.grpc sends by
    default); calls still open `timeout` s after the run's end count as TimeoutError."""
    import grpc
    lat, codes = [], {}
    state = {"left": requests, "open": 0}
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(METHOD)           # bytes in, bytes out
        await call(body, timeout=timeout)       # connected before the clock starts
        t0 = time.perf_counter()
        t_end = t0 + seconds

        async def caller():
            while state["left"] > 0 and time.perf_counter() < t_end:
                state["left"] -= 1
                state["open"] += 1
                t = time.perf_counter()
                try:
                    await call(body, timeout=deadline)
                except grpc.aio.AioRpcError as e:
                    k = e.code().name
                    codes[k] = codes.get(k, 0) + 1
                    continue
                finally:
                    state["open"] -= 1
                lat.append(time.perf_counter() - t)
                codes[200] = codes.get(200, 0) + 1
        try:
            await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(concurrency))),
                                   seconds + timeout)
        except asyncio.TimeoutError:
            codes["TimeoutError"] = codes.get("TimeoutError", 0) + state["open"]
        return lat, codes, time.perf_counter() - t0


class _H2Run:
    pass


class _H2Client(asyncio.Protocol):
    """One HTTP/2 connection of `drive_h2`: `concurrency` calls open on it at a time, each
    a prebuilt HEADERS + DATA pair whose stream id is the only byte that changes; the
    answer's trailers (decoded with the ``hpack`` package) end a call and start the next,
    from `data_received`. It honours the server's flow-control windows (grpcio's
    connection window starts at 64 KiB) and opens its own wide."""

    def __init__(self, r):
        import hpack
        self.r, self.buf, self.tr = r, bytearray(), None
        self.dec, self.cache = hpack.Decoder(), {}
        self.sid, self.open = 1, {}          # stream id -> start time
        self.window, self.stream_window, self.recv = 65535, 65535, 0
        self.first = True

    def connection_made(self, tr):
        import socket
        self.tr = tr
        tr.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tr.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                 + _frame(4, 0, 0, struct.pack(">HIHI", 0x2, 0, 0x4, (1 << 31) - 1))
                 + _frame(8, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535)))

    def fill(self):
        """Open calls until `concurrency` are open or the windows are spent."""
        r, out = self.r, []
        n = len(r.body)
        while (len(self.open) < r.concurrency and r.left > 0 and n <= self.window
               and n <= self.stream_window and time.perf_counter() < r.t_end):
            r.left -= 1
            block = r.block_first if self.first else r.block
            self.first = False
            out.append(_frame(1, 0x4, self.sid, block))
            out.append(_frame(0, 0x1, self.sid, r.body))
            self.window -= n
            self.open[self.sid] = time.perf_counter()
            self.sid += 2
        if out:
            self.tr.write(b"".join(out))
        if r.timed and not self.open and (r.left <= 0 or time.perf_counter() >= r.t_end):
            self.tr.close()

    def data_received(self, data):
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        out = []
        while n - pos >= 9:
            length = int.from_bytes(buf[pos:pos + 3], "big")
            if n - pos - 9 < length:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            if ftype == 4 and not flags & 1:                # SETTINGS
                for i in range(0, len(payload), 6):
                    k, v = struct.unpack_from(">HI", payload, i)
                    if k == 0x4:
                        self.stream_window = v
                out.append(_frame(4, 1, 0))
            elif ftype == 6 and not flags & 1:              # PING
                out.append(_frame(6, 1, 0, payload))
            elif ftype == 8:                                # WINDOW_UPDATE
                if sid == 0:
                    self.window += int.from_bytes(payload, "big") & 0x7FFFFFFF
            elif ftype == 0:                                # DATA
                self.recv += length
                if self.recv > 1 << 20:
                    out.append(_frame(8, 0, 0, struct.pack(">I", self.recv)))
                    self.recv = 0
            elif ftype == 1:                                # HEADERS (no CONTINUATION:
                status = self._status(payload, flags)       # the answers are small)
                if status is not None:
                    self._done(sid, status)
            elif ftype == 3:                                # RST_STREAM
                self._done(sid, "RST_STREAM")
            elif ftype == 7:                                # GOAWAY
                self._done(None, "GOAWAY")
        del buf[:pos]
        if out:
            self.tr.write(b"".join(out))
        self.fill()

    def _status(self, payload, flags):
        if flags & 0x8:
            payload = payload[1:len(payload) - payload[0]]
        if flags & 0x20:
            payload = payload[5:]
        got = self.cache.get(payload)
        if got is None:
            before = list(self.dec.header_table.dynamic_entries)
            got = dict(self.dec.decode(payload, raw=True))
            if list(self.dec.header_table.dynamic_entries) != before:
                self.cache.clear()          # (cached blocks may index into the table)
            self.cache[payload] = got
        s = got.get(b"grpc-status")
        return None if s is None else int(s)

    def _done(self, sid, status):
        r = self.r
        t = self.open.pop(sid, None) if sid is not None else None
        if sid is None:                     # GOAWAY: every open call failed
            for _ in self.open:
                r.codes[status] = r.codes.get(status, 0) + 1
            self.open.clear()
            return
        if t is None:
            return
        if status == 0:
            r.lat.append(time.perf_counter() - t)
            r.codes[200] = r.codes.get(200, 0) + 1
        else:
            r.codes[status] = r.codes.get(status, 0) + 1

    def connection_lost(self, exc):
        if not self.r.closed.done():
            self.r.closed.set_result(None)


def _frame(ftype, flags, sid, payload=b""):
    n = len(payload)
    return struct.pack(">HBBBI", n >> 8, n & 0xFF, ftype, flags, sid) + payload


async def drive_h2(address, body, concurrency, requests, seconds, timeout=30.0,
                   deadline=None):
    """As `drive_grpc`, from a bare HTTP/2 client (`_H2Client`, one connection): the
    request's header block (HPACK-encoded by the ``hpack`` package: the first call
    indexes every field, the next ones name them by index, as grpc's C core does) and its
    DATA frame are built once, so the client spends tens of microseconds a call where
    grpc.aio spends 150-260 (benchmarks/RESULTS.md) on the 2 cores it shares with the
    server. `deadline` as `drive_grpc`'s."""
    import hpack
    host, port = address.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    enc = hpack.Encoder()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", METHOD),
              (":authority", address), ("content-type", "application/grpc"),
              ("te", "trailers"), ("user-agent", "sampan-grpc-load/1")]
    if deadline is not None:
        fields.append(("grpc-timeout", f"{max(int(deadline * 1e3), 1)}m"))
    r = _H2Run()
    r.block_first, r.block = enc.encode(fields), enc.encode(fields)
    r.body = b"\0" + len(body).to_bytes(4, "big") + body
    r.concurrency, r.lat, r.codes = concurrency, [], {}
    r.left = 1                     # one call first, connected and warm (the server's
    r.closed = loop.create_future()     # SETTINGS may call fill() before the await ends)
    r.t_end, r.timed = time.perf_counter() + 3600, False
    tr, c = await loop.create_connection(lambda: _H2Client(r), host, int(port))
    left = requests
    c.fill()
    while c.open:
        await asyncio.sleep(0.001)
    r.lat, r.codes, r.left = [], {}, left
    t0 = time.perf_counter()
    r.t_end, r.timed = t0 + seconds, True
    c.fill()
    try:
        await asyncio.wait_for(asyncio.shield(r.closed), seconds + timeout)
    except asyncio.TimeoutError:
        r.codes["TimeoutError"] = r.codes.get("TimeoutError", 0) + len(c.open)
        tr.abort()
    return r.lat, r.codes, time.perf_counter() - t0


GRPC_CLIENTS = {"grpc": "grpc.aio", "grpc_h2": "raw HTTP/2 (hpack)"}


def grpc_vs_http(server, model, x, args, info, conc=64, target=1.2, clients=None):
    """The point described in the module doc; `server` is serving.py's ServerProcess
    (started with --grpc-port 0). `clients`: the gRPC fronts to drive ("grpc": the
    grpc.aio client, "grpc_h2": the bare HTTP/2 one; default both). Returns the ratio
    lines, each gRPC client's requests/s over HTTP's."""
    from http_load import _run_client, block_stats, drive_raw
    from serving import _client_cpu, batch_counts, binary_body
    bodies = {"http_binary": binary_body({"x": ("FP32", x)}),
              "http_json": json_body({"x": ("FP32", x)})}
    body_g = infer_request(model, {"x": ("FP32", x)})
    n, secs = max(1, args.requests // args.blocks), args.seconds / args.blocks
    grpcs = tuple(clients or getattr(args, "grpc_clients", None) or GRPC_CLIENTS)
    impl = getattr(server, "grpc_impl", None) or "native"
    dl = getattr(args, "grpc_deadline", None)

    def run(front):
        if front == "grpc":
            return asyncio.run(drive_grpc(server.grpc, body_g, conc, n, secs, deadline=dl))
        if front == "grpc_h2":
            return _run_client(drive_h2(server.grpc, body_g, conc, n, secs, deadline=dl))
        return _run_client(drive_raw(server.url, model, *bodies[front], conc, n, secs))
    fronts = ("http_binary", "http_json") + grpcs
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
               "client": GRPC_CLIENTS.get(front, "raw"), **info}
        if front in GRPC_CLIENTS:
            rec["grpc_impl"], rec["grpc_deadline_s"] = impl, dl
        print(json.dumps(rec), flush=True)
        out[front] = rec
    lines = []
    for g in grpcs:
        for http in ("http_binary", "http_json"):
            # block by block (the same moment of the machine), then the median
            r = float(np.median([a["rps"] / max(h["rps"], 1e-9)
                                 for a, h in zip(blocks[g], blocks[http])]))
            line = {"workload": "S1", "system": "sampan_serve", "mode": f"{g}/{http}",
                    "metric": "throughput_ratio", "model": model, "concurrency": conc,
                    "grpc_impl": impl, "grpc_client": GRPC_CLIENTS[g],
                    "value": round(r, 3), "target": target, "target_met": r >= target,
                    "server_cpu_per_request_ratio": round(
                        out[http]["server_cpu_us_per_request"]
                        / max(out[g]["server_cpu_us_per_request"], 1e-9), 3)}
            print(json.dumps(line), flush=True)
            lines.append(line)
    return lines


def main(argv=None):
    """This point alone, one server process per --grpc-impl (each against HTTP in its
    own run): python benchmarks/grpc_load.py [--quick] [--grpc-impl native grpcio]"""
    import argparse
    import sys
    import tempfile

    from onnx_conformance import machine
    from serving import ServerProcess, build_models
    ap = argparse.ArgumentParser(description="gRPC vs HTTP requests/s at one concurrency")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--delay-us", type=int, default=500)
    ap.add_argument("--grpc-impl", nargs="+", default=["native", "grpcio"],
                    choices=["native", "grpcio"])
    ap.add_argument("--grpc-clients", nargs="+", choices=list(GRPC_CLIENTS),
                    default=list(GRPC_CLIENTS))
    ap.add_argument("--grpc-deadline", type=float, metavar="S",
                    help="each gRPC call's timeout (default none, as tritonclient.grpc; "
                         "the HTTP requests carry none either)")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.seconds = min(args.requests, 600), min(args.seconds, 3.0)
    info = machine()
    with tempfile.TemporaryDirectory(prefix="sampan-grpc-") as folder:
        repo, _ = build_models(folder, args.delay_us, lambda m: print(m, flush=True), 512,
                               "arriving")
        x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
        for impl in args.grpc_impl:
            server = ServerProcess(repo, ("--grpc-port", "0", "--grpc-impl", impl))
            server.grpc_impl = impl
            try:
                grpc_vs_http(server, "mlp_batch", x, args, info, args.concurrency)
            finally:
                server.stop()
    return 0


def json_body(inputs):
    """An all-JSON infer request (JSON outputs) and its length: sent with
    Inference-Header-Content-Length equal to the body's length (no binary part)."""
    b = json.dumps({"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                                "data": a.ravel().tolist()}
                               for n, (dt, a) in inputs.items()]}).encode()
    return b, len(b)


if __name__ == "__main__":
    import sys
    sys.exit(main())
