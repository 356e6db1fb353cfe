"""Load clients for the serving benchmark (`serving.py`): `drive` over httpx and
`drive_raw`, a bare asyncio Protocol per keep-alive connection, the default.

Both POST one prebuilt infer body from `concurrency` connections until `requests` are
sent or `seconds` pass, and return (latencies of the 200s, {status: count}, wall s).
"""
from __future__ import annotations

import asyncio
import time


async def drive(url, model, body, hlen, concurrency, requests, seconds, timeout=30.0):
    """`requests` POSTs (or `seconds`, whichever ends first) from `concurrency` tasks over
    keep-alive connections; returns (latencies_s of 200s, {status: count}, wall_s)."""
    import httpx
    limits = httpx.Limits(max_connections=concurrency,
                          max_keepalive_connections=concurrency)
    headers = ({"Content-Type": "application/json"} if hlen is None else   # a JSON body
               {"Inference-Header-Content-Length": str(hlen),
                "Content-Type": "application/octet-stream"})
    lat, codes = [], {}
    left = [requests]
    t_end = time.perf_counter() + seconds
    import socket
    # TCP_NODELAY: the client writes headers and body apart (h11); without it the body
    # waits for the server's delayed ACK
    tr = httpx.AsyncHTTPTransport(limits=limits, socket_options=[
        (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    async with httpx.AsyncClient(base_url=url, transport=tr, timeout=timeout) as c:
        async def one():
            while left[0] > 0 and time.perf_counter() < t_end:
                left[0] -= 1
                t = time.perf_counter()
                try:
                    r = await c.post(f"/v2/models/{model}/infer", content=body,
                                     headers=headers)
                    code = r.status_code
                except Exception as e:      # noqa: BLE001 -- counted as a failure
                    code = type(e).__name__
                dt = time.perf_counter() - t
                codes[code] = codes.get(code, 0) + 1
                if code == 200:
                    lat.append(dt)
        t0 = time.perf_counter()
        await asyncio.gather(*[one() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    return lat, codes, wall


class _Conn(asyncio.Protocol):
    """One keep-alive connection of `drive_raw`: writes the prebuilt request, finds the
    status and Content-Length in the response head with bytes.find, and sends the next
    request from `data_received` (no stream reader, no task switch per request)."""

    def __init__(self, run, req=None):
        self.run, self.buf, self.need, self.t, self.tr = run, b"", -1, 0.0, None
        self.busy = False
        self.req = run.req if req is None else req

    def connection_made(self, transport):
        self.tr = transport

    def next(self):
        r = self.run
        if r.left > 0 and time.perf_counter() < r.t_end:
            r.left -= 1
            self.busy = True
            self.t = time.perf_counter()
            self.tr.write(self.req)
        else:
            self.busy = False
            self.tr.close()

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        while True:
            if self.need < 0:
                h = buf.find(b"\r\n\r\n")
                if h < 0:
                    break
                # "\r\n" first: not inference-header-content-length
                i = buf.find(b"\r\ncontent-length:", 0, h)
                if i < 0:
                    i = buf.lower().find(b"\r\ncontent-length:", 0, h)
                self.code = int(buf[9:12])
                self.need = h + 4 + (int(buf[i + 17:buf.find(b"\r\n", i + 2, h + 2)])
                                     if i >= 0 else 0)
            if len(buf) < self.need:
                break
            buf, self.need, self.busy = buf[self.need:], -1, False
            r = self.run
            r.codes[self.code] = r.codes.get(self.code, 0) + 1
            if self.code == 200:
                r.lat.append(time.perf_counter() - self.t)
            self.next()
        self.buf = buf

    def connection_lost(self, exc):
        r = self.run
        if self.busy or exc is not None:      # closed with an answer owed: a failure
            name = type(exc).__name__ if exc is not None else "ConnectionClosed"
            r.codes[name] = r.codes.get(name, 0) + 1
        r.open -= 1
        if r.open == 0 and not r.closed.done():
            r.closed.set_result(None)


async def drive_raw(url, model, body, hlen, concurrency, requests, seconds, timeout=30.0):
    """As `drive`, from keep-alive connections driven by a bare asyncio Protocol: the
    request bytes are built once and a response is delimited by its Content-Length, so
    the client spends a few tens of microseconds a request (httpx spends milliseconds at
    concurrency 64; asyncio streams spent ~60 us, a quarter of the 2 cores the server
    shares). A connection that stalls past `timeout` is counted as a failure. `body` and
    `hlen` may be lists of the same length: connection i then sends body i % len (mixed
    requests, e.g. sentences of several lengths, sharing the server's batches)."""
    import socket
    host, port = url[len("http://"):].rsplit(":", 1)
    loop = asyncio.get_running_loop()

    class Run:
        pass
    r = Run()
    def request(body, hlen):
        binary = (f"Content-Type: application/octet-stream\r\n"
                  f"Inference-Header-Content-Length: {hlen}\r\n") if hlen is not None else \
            "Content-Type: application/json\r\n"          # hlen None: an all-JSON body
        return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n{binary}"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    reqs = ([request(b, h) for b, h in zip(body, hlen)] if isinstance(body, list)
            else [request(body, hlen)])
    r.req = reqs[0]
    r.lat, r.codes, r.left = [], {}, requests
    r.t_end = time.perf_counter() + seconds
    r.closed, r.conns, r.open = loop.create_future(), [], concurrency
    t0 = time.perf_counter()
    for i in range(concurrency):
        tr, c = await loop.create_connection(
            lambda i=i: _Conn(r, reqs[i % len(reqs)]), host, int(port))
        tr.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        r.conns.append(c)
    for c in r.conns:       # all connected first: a finished one's fd is not reused
        c.next()
    try:
        await asyncio.wait_for(asyncio.shield(r.closed), seconds + timeout)
    except asyncio.TimeoutError:
        for c in r.conns:
            if c.busy:
                r.codes["TimeoutError"] = r.codes.get("TimeoutError", 0) + 1
                c.busy = False
            c.tr.abort()
    return r.lat, r.codes, time.perf_counter() - t0


def block_stats(bl):
    """The figures of one system's timed blocks (each a dict with rps, lat, codes, ok,
    server_cpu, client_cpu), as the serving benchmarks print them: median requests/s and
    its range, p50/p99 latency, status counts, server and client CPU per answered request."""
    import numpy as np
    ok = sum(x["ok"] for x in bl)
    lat_ms = np.array([t for x in bl for t in x["lat"]] or [np.nan]) * 1e3
    codes: dict = {}
    for x in bl:
        for c, n in x["codes"].items():
            codes[str(c)] = codes.get(str(c), 0) + n
    rps = [x["rps"] for x in bl]
    return {"metric": "requests_per_s", "value": round(float(np.median(rps)), 1),
            "min": round(min(rps), 1), "max": round(max(rps), 1), "blocks": len(bl),
            "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
            "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
            "requests": sum(codes.values()), "failed": sum(codes.values()) - ok,
            "statuses": codes,
            "server_cpu_us_per_request": round(
                1e6 * sum(x["server_cpu"] for x in bl) / max(ok, 1), 1),
            "client_cpu_us_per_request": round(
                1e6 * sum(x["client_cpu"] for x in bl) / max(ok, 1), 1)}


def _run_client(coro):
    """asyncio.run on uvloop when it is installed (the server's loop too): the client's
    CPU per request is part of what the 2 cores are shared by."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
