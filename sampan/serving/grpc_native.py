"""The native gRPC front end (``sampan serve --grpc-impl native``, the default): the KServe
v2 / Triton service of `grpc_server.py` (the same `_Service` handlers, the same data
plane) spoken by our own HTTP/2 server, an asyncio `Protocol` on the HTTP front end's
event loop, instead of grpcio's C core and its poller thread.

What it speaks (RFC 9113 as gRPC over HTTP/2 uses it, unary calls only):
  * the connection preface, SETTINGS (and their ACK), PING, GOAWAY, RST_STREAM,
    WINDOW_UPDATE, HEADERS + CONTINUATION (HPACK: `grpc_hpack.py`), DATA with padding;
    PRIORITY and unknown frames are ignored, PUSH_PROMISE from a client is an error;
  * flow control both ways: the server opens its receive windows wide (a stream's to
    2^31-1, the connection's topped up as data arrives) and sends no more than the
    client's windows allow, holding the rest until WINDOW_UPDATE;
  * a call is ``POST /inference.GRPCInferenceService/<Method>`` with
    ``content-type: application/grpc``; its one message (5-byte prefix: compressed flag,
    big-endian length; gzip / deflate ``grpc-encoding`` accepted) is parsed with the
    shipped protobuf classes; ``grpc-timeout`` becomes the call's deadline
    (``time_remaining()``, which `DataPlane.infer` turns into the request's timeout);
  * answers: HEADERS (``:status 200``), DATA (the message), trailers ``grpc-status: 0``;
    an error is a trailers-only answer with ``grpc-status``, ``grpc-message``
    (percent-encoded) and ``retry-after`` when admission set one; an unknown method is
    UNIMPLEMENTED, a message over `max_message_bytes` RESOURCE_EXHAUSTED.

Answers that complete in one turn of the loop (a batch's worth) leave in one socket
write, and the frames of many calls read in one `data_received` are dispatched together,
so a batcher sees them arrive together (grpcio hands them over one at a time).

`stop_async(grace)` closes the listener, sends GOAWAY on every connection (calls the
client opens after it are refused with REFUSED_STREAM), lets the open calls finish for
`grace` seconds, then cancels the rest (answered UNAVAILABLE) and closes the connections.

    >>> # fe = NativeGrpcFrontEnd(plane, "127.0.0.1", 0).start(); fe.port; ...; fe.stop(5)
"""
from __future__ import annotations

import asyncio
import struct
import time

from .errors import RequestError
from .grpc_frames import (ACK, COMPRESSION_ERROR, CONTINUATION, DATA, END_HEADERS, END_STREAM,
                          ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY,
                          HEADERS, INTERNAL_ERROR, MAX_FRAME, MAX_HEADER_BLOCK, MAX_STREAMS,
                          MAX_WINDOW, NO_ERROR, OK_TRAILERS, PADDED, PING, PREFACE, PRIORITY_FLAG,
                          PROTOCOL_ERROR, PUSH_PROMISE, REFILL, REFUSED_STREAM, RESPONSE_HEADERS,
                          RST_STREAM, SETTINGS, STATUS, STREAM_CLOSED, WINDOW_UPDATE, CallError,
                          error_block, frame, grpc_timeout, inflate)
from .grpc_hpack import Decoder, HpackError, literal
from .grpc_service import METHODS, SERVICE, FrontEndBase, _Service
from .ops import LOG


_HEAD = struct.Struct(">HBBBI")       # a frame's 9 bytes: length (16 + 8 bits), type,
                                      # flags, stream id (and the reserved bit)


class _Context:
    """What a `_Service` handler asks of its call: the seconds left until its deadline."""
    __slots__ = ("deadline",)

    def __init__(self, deadline):
        self.deadline = deadline

    def time_remaining(self):
        return None if self.deadline is None else self.deadline - time.monotonic()


class _Stream:
    __slots__ = ("sid", "headers", "body", "ended", "window", "pending", "done", "task")

    def __init__(self, sid, headers, window):
        self.sid, self.headers, self.window = sid, headers, window
        self.body = bytearray()
        self.ended = False        # the client's half is closed (END_STREAM seen)
        self.pending = None       # [memoryview of DATA still to send, trailer block]
        self.done = False         # answered or reset: nothing more is sent
        self.task = None


class _Error(Exception):
    """A connection error: GOAWAY with `code`, then close."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


class H2Connection(asyncio.Protocol):
    """One client connection (see the module doc)."""

    def __init__(self, fe):
        self.fe, self.loop = fe, fe.loop
        self.buf = bytearray()
        self.preface = False
        self.streams: dict = {}
        self.blocked: dict = {}   # sid -> stream with DATA held by flow control
        self.last_sid = 0
        self.hpack = Decoder(max_list=MAX_HEADER_BLOCK)
        self.cont = None          # (sid, flags, block so far) while CONTINUATIONs come
        self.peer_frame = 16384
        self.peer_window = 65535  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.send_window = 65535  # the connection's send window
        self.received = 0         # bytes of DATA since the last connection WINDOW_UPDATE
        self.out: list = []
        self.flush_soon = False
        self.goaway = False       # the server sent GOAWAY: no new streams
        self.peer_goaway = False
        self.table_update = False  # the next header block starts with a size update
        self.closed = False
        self.transport = None

    # ------------------------------------------------------------ transport events
    def connection_made(self, transport):
        self.transport = transport
        self.fe.conns.add(self)
        # a connection that never says it speaks HTTP/2 holds nothing for long
        self._preface_timer = self.loop.call_later(self.fe.preface_timeout, self._no_preface)
        settings = struct.pack(">HIHIHIHI", 0x3, MAX_STREAMS, 0x4, MAX_WINDOW,
                               0x5, MAX_FRAME, 0x6, MAX_HEADER_BLOCK)
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))

    def _no_preface(self):
        if not self.preface:
            self.close(PROTOCOL_ERROR, f"no HTTP/2 connection preface within "
                                       f"{self.fe.preface_timeout:g} s")

    def connection_lost(self, exc):
        self._preface_timer.cancel()
        self.closed = True
        self.fe.conns.discard(self)
        for st in self.streams.values():
            st.done = True
        self.streams.clear()
        self.blocked.clear()
        self.fe.idle_changed()

    def pause_writing(self):
        self.transport.pause_reading()      # a client that does not read sends no more

    def resume_writing(self):
        if not self.closed:
            self.transport.resume_reading()

    def data_received(self, data):
        buf = self.buf
        buf += data
        try:
            if not self.preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise _Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[:len(PREFACE)] != PREFACE:
                    raise _Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface "
                                 "(gRPC needs HTTP/2 with prior knowledge)")
                del buf[:len(PREFACE)]
                self.preface = True
                self._preface_timer.cancel()
            pos, n = 0, len(buf)
            head = _HEAD.unpack_from
            while n - pos >= 9 and not self.closed:
                hi, lo, ftype, flags, sid = head(buf, pos)
                length = (hi << 8) | lo
                if length > MAX_FRAME:
                    raise _Error(FRAME_SIZE_ERROR, f"a frame of {length} bytes; the "
                                 f"server's SETTINGS_MAX_FRAME_SIZE is {MAX_FRAME}")
                end = pos + 9 + length
                if end > n:
                    break
                payload = buf[pos + 9:end]
                pos = end
                self._frame(ftype, flags, sid & 0x7FFFFFFF, payload)
            del buf[:pos]
        except _Error as e:
            self.close(e.code, str(e))
        except Exception as e:  # noqa: BLE001 -- a server bug: this connection ends, logged
            LOG.exception("gRPC: a connection failed")
            self.close(INTERNAL_ERROR, f"internal error: {type(e).__name__}")
        self.flush()

    # ------------------------------------------------------------ frames in
    def _frame(self, ftype, flags, sid, payload):
        if self.cont is not None and ftype != CONTINUATION:
            raise _Error(PROTOCOL_ERROR, "a header block interrupted by another frame")
        if ftype == DATA:
            self._data(flags, sid, payload)
        elif ftype == HEADERS:
            self._headers_frame(flags, sid, payload)
        elif ftype == WINDOW_UPDATE:        # (grpc's C core sends two an answer)
            self._window_update(sid, payload)
        elif ftype == CONTINUATION:
            c = self.cont
            if c is None or c[0] != sid:
                raise _Error(PROTOCOL_ERROR, "CONTINUATION without a header block to go on")
            c[2].extend(payload)
            if len(c[2]) > MAX_HEADER_BLOCK:
                raise _Error(ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} "
                             "bytes")
            if flags & END_HEADERS:
                self.cont = None
                self._headers(sid, c[1], c[2])
        elif ftype == SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == PING:
            if len(payload) != 8 or sid:
                raise _Error(FRAME_SIZE_ERROR if sid == 0 else PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, bytes(payload)))
        elif ftype == RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise _Error(PROTOCOL_ERROR, "bad RST_STREAM")
            st = self.streams.pop(sid, None)
            if st is not None:        # the client cancelled: its answer is dropped
                st.done = True
                self.blocked.pop(sid, None)
                self.fe.idle_changed()
        elif ftype == GOAWAY:
            self.peer_goaway = True
            if not self.streams:
                self.close(NO_ERROR, "")
        elif ftype == PUSH_PROMISE:
            raise _Error(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and unknown frame types: ignored (RFC 9113 5.5)

    def _headers_frame(self, flags, sid, payload):
        if sid == 0 or sid % 2 == 0:
            raise _Error(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise _Error(PROTOCOL_ERROR, "padded HEADERS without a pad length")
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if end < start:
            raise _Error(PROTOCOL_ERROR, "HEADERS padding longer than the frame")
        block = payload[start:end]
        if flags & END_HEADERS:
            self._headers(sid, flags, block)
        else:
            self.cont = (sid, flags, bytearray(block))

    def _headers(self, sid, flags, block):
        try:
            fields = self.hpack.decode(block)   # always: it keeps the dynamic table
        except HpackError as e:
            raise _Error(COMPRESSION_ERROR, str(e)) from None
        st = self.streams.get(sid)
        if st is not None:                      # trailers from the client
            if st.ended or not flags & END_STREAM:
                self._reset(st, PROTOCOL_ERROR)
                return
            st.ended = True
            self._dispatch(st)
            return
        if sid <= self.last_sid:
            raise _Error(PROTOCOL_ERROR, f"HEADERS on closed stream {sid}")
        self.last_sid = sid
        if self.goaway or len(self.streams) >= MAX_STREAMS:
            self.out.append(frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        st = _Stream(sid, fields, self.peer_window)
        self.streams[sid] = st
        if flags & END_STREAM:
            st.ended = True
            self._dispatch(st)

    def _data(self, flags, sid, payload):
        if sid == 0:
            raise _Error(PROTOCOL_ERROR, "DATA on stream 0")
        self.received += len(payload)
        if self.received >= REFILL:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0
        st = self.streams.get(sid)
        if st is None or st.ended:
            if sid > self.last_sid:
                raise _Error(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            if st is not None:
                self._reset(st, STREAM_CLOSED)
            return                  # a stream already answered or reset: dropped
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _Error(PROTOCOL_ERROR, "DATA padding longer than the frame")
            payload = payload[1:len(payload) - payload[0]]
        if st.task is None:         # (a stream answered early ignores the rest)
            st.body += payload
            if len(st.body) > self.fe.max_message_bytes + 5:
                self._answer_error(st, STATUS["RESOURCE_EXHAUSTED"],
                                   f"gRPC: the request message is larger than the server's "
                                   f"limit of {self.fe.max_message_bytes} bytes")
                st.task = False
        if flags & END_STREAM:
            st.ended = True
            if st.task is None:
                self._dispatch(st)
            elif st.done:
                self._close_stream(st)

    def _settings(self, flags, sid, payload):
        if sid:
            raise _Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _Error(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == 0x4:                      # INITIAL_WINDOW_SIZE
                if value > MAX_WINDOW:
                    raise _Error(FLOW_CONTROL_ERROR, f"INITIAL_WINDOW_SIZE {value}")
                delta, self.peer_window = value - self.peer_window, value
                for st in self.streams.values():
                    st.window += delta
            elif key == 0x1 and value < 4096:   # HEADER_TABLE_SIZE: the server's blocks
                self.table_update = True        # index nothing, but must say it (7541 4.2)
            elif key == 0x5:                    # MAX_FRAME_SIZE
                if not 16384 <= value <= (1 << 24) - 1:
                    raise _Error(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.peer_frame = value
        self.out.append(frame(SETTINGS, ACK, 0))
        self._pump()

    def _window_update(self, sid, payload):
        if len(payload) != 4:
            raise _Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise _Error(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise _Error(FLOW_CONTROL_ERROR, "the connection window passed 2^31-1")
            if not self.blocked:
                return
        else:
            st = self.streams.get(sid)
            if st is None:
                return
            if inc == 0:
                self._reset(st, PROTOCOL_ERROR)
                return
            st.window += inc
        self._pump()

    # ------------------------------------------------------------ calls
    def _dispatch(self, st):
        h = dict(st.headers)
        st.headers = None
        path, ctype, method = h.get(b":path"), h.get(b"content-type"), h.get(b":method")
        if method != b"POST" or ctype is None or not ctype.startswith(b"application/grpc"):
            status = b"405" if method != b"POST" else b"415"
            self._finish(st, [frame(HEADERS, END_HEADERS | END_STREAM, st.sid,
                                    self._block(literal(b":status", status)))])
            return
        name = self.fe.routes.get(path)
        if name is None:
            path = (path or b"").decode("latin-1")
            self._answer_error(st, STATUS["UNIMPLEMENTED"],
                               f"gRPC: unknown method {path!r}; the "
                               f"server serves /{SERVICE}/{{{', '.join(METHODS)}}}")
            return
        body, st.body = st.body, None
        n = int.from_bytes(body[1:5], "big") if len(body) >= 5 else -1
        if n < 0 or len(body) != 5 + n:
            self._answer_error(st, STATUS["INTERNAL"],
                               f"gRPC: {name} takes one length-prefixed request message; "
                               f"the call sent {len(body)} bytes that do not frame one")
            return
        msg = bytes(body[5:])
        if body[0]:
            try:
                msg = inflate(h.get(b"grpc-encoding"), msg, self.fe.max_message_bytes)
            except RequestError as e:
                self._answer_error(st, STATUS[e.grpc_code], str(e))
                return
        deadline = None
        timeout = h.get(b"grpc-timeout")
        if timeout is not None:
            t = grpc_timeout(timeout)
            if t is not None:
                deadline = time.monotonic() + t
        st.task = self.loop.create_task(self._call(st, name, msg, deadline))

    async def _call(self, st, name, msg, deadline):
        fe = self.fe
        try:
            try:
                req = fe.requests[name].FromString(msg)
            except Exception as e:  # noqa: BLE001 -- protobuf's DecodeError
                raise RequestError(f"gRPC {name}: the request is not a {name}Request: "
                                   f"{e}", 500) from None
            resp = await getattr(fe.service, name)(req, _Context(deadline))
            data = resp.SerializeToString()
            if len(data) > fe.max_message_bytes:
                raise CallError(f"gRPC {name}: the answer of {len(data)} bytes is larger "
                                f"than the server's limit of {fe.max_message_bytes}",
                                "RESOURCE_EXHAUSTED", 500)
        except RequestError as err:
            meta = [(k.lower(), str(v)) for k, v in err.headers.items()
                    if k.lower() == "retry-after"]
            self._answer_error(st, STATUS.get(err.grpc_code, 2), str(err), meta)
            return
        except asyncio.CancelledError:      # the shutdown's grace ran out
            self._answer_error(st, STATUS["UNAVAILABLE"],
                               "the server shut down before the call finished")
            return
        except Exception as err:  # noqa: BLE001 -- a server bug: answered INTERNAL, logged
            LOG.exception("gRPC %s failed", name)
            self._answer_error(st, STATUS["INTERNAL"],
                               f"internal error: {type(err).__name__}: {err}")
            return
        self._answer(st, data)

    # ------------------------------------------------------------ frames out
    def _answer(self, st, data):
        if st.done:
            return
        sid = st.sid
        n = len(data) + 5
        out = [frame(HEADERS, END_HEADERS, sid, self._block(RESPONSE_HEADERS))]
        if n <= self.peer_frame and n <= st.window and n <= self.send_window:
            st.window -= n
            self.send_window -= n
            out.append(frame(DATA, 0, sid, b"\0" + (n - 5).to_bytes(4, "big") + data))
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, sid,
                             self._block(OK_TRAILERS)))
            self._finish(st, out)
            return
        self.out.extend(out)
        st.pending = [memoryview(b"\0" + (n - 5).to_bytes(4, "big") + data), OK_TRAILERS]
        self.blocked[sid] = st
        self._pump()
        self._schedule()

    def _answer_error(self, st, code, msg, meta=()):
        if st.done:
            return
        self._finish(st, [frame(HEADERS, END_HEADERS | END_STREAM, st.sid,
                                self._block(error_block(code, msg, meta)))])

    def _block(self, block):
        if self.table_update:           # (the client shrank HEADER_TABLE_SIZE below 4096)
            self.table_update = False
            return b"\x20" + block
        return block

    def _finish(self, st, frames):
        self.out.extend(frames)
        st.done = True
        if not st.ended:                # answered before the client finished sending
            self.out.append(frame(RST_STREAM, 0, st.sid, struct.pack(">I", NO_ERROR)))
        self._close_stream(st)
        self._schedule()

    def _close_stream(self, st):
        self.streams.pop(st.sid, None)
        self.blocked.pop(st.sid, None)
        if not self.streams:
            if self.peer_goaway or self.goaway:
                self.flush()
                self.close(NO_ERROR, "")
            self.fe.idle_changed()

    def _reset(self, st, code):
        st.done = True
        self.out.append(frame(RST_STREAM, 0, st.sid, struct.pack(">I", code)))
        self._close_stream(st)

    def _pump(self):
        """Send what flow control held, as far as the windows now allow."""
        for st in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            data, trailers = st.pending
            while data and self.send_window > 0 and st.window > 0:
                k = min(len(data), self.send_window, st.window, self.peer_frame)
                self.out.append(frame(DATA, 0, st.sid, bytes(data[:k])))
                data = data[k:]
                self.send_window -= k
                st.window -= k
            st.pending[0] = data
            if not data:
                self.blocked.pop(st.sid, None)
                self._finish(st, [frame(HEADERS, END_HEADERS | END_STREAM, st.sid,
                                        self._block(trailers))])

    def _schedule(self):
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self.flush)

    def flush(self):
        self.flush_soon = False
        if self.out and not self.closed:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def send_goaway(self):
        """GOAWAY: the client opens no new calls here; the connection closes once the
        open ones are answered."""
        if self.closed or self.goaway:
            return
        self.goaway = True
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_sid, NO_ERROR)))
        if not self.streams:
            self.flush()
            self.close(NO_ERROR, "")
        else:
            self.flush()

    def close(self, code, msg):
        """End the connection (GOAWAY with `code` first when it is an error)."""
        if self.closed:
            return
        if code != NO_ERROR:
            LOG.warning("gRPC: closing a connection: %s", msg)
            self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_sid, code)
                                  + msg.encode("utf-8", "replace")[:256]))
        self.flush()
        self.closed = True
        self.transport.close()


class NativeGrpcFrontEnd(FrontEndBase):
    """The gRPC service on our own HTTP/2 server over `plane` on `host`:`port` (0: a free
    port; see the module doc and `FrontEndBase` for the thread mode)."""

    impl = "native"
    preface_timeout = 10.0    # s a new connection has to send the HTTP/2 preface

    def __init__(self, plane, host="127.0.0.1", port=0, max_message_bytes=64 << 20):
        super().__init__(plane, host, port, max_message_bytes)
        self.conns: set = set()
        self._listener = None
        self._idle = None

    async def start_async(self) -> "NativeGrpcFrontEnd":
        from .errors import ServingError
        self.service = _Service(self.plane)
        self.requests = {m: getattr(self.service.pb, f"{m}Request") for m in METHODS}
        self.routes = {f"/{SERVICE}/{m}".encode(): m for m in METHODS}
        self.loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        try:
            self._listener = await self.loop.create_server(
                lambda: H2Connection(self), self.host, self.port, backlog=2048,
                reuse_address=True)
        except OSError as e:
            raise ServingError(f"serving: cannot listen for gRPC on {self.address} "
                               f"(--grpc-port {self.port}: in use?): {e}") from None
        self.port = self._listener.sockets[0].getsockname()[1]
        return self

    def idle_changed(self):
        if self._idle is not None and not any(c.streams for c in self.conns):
            self._idle.set()

    async def stop_async(self, grace=None) -> None:
        """Refuse new calls, let the open ones finish within `grace` s, cancel the rest."""
        srv, self._listener = self._listener, None
        if srv is None:
            return
        srv.close()
        self._idle.clear()
        for c in list(self.conns):
            c.send_goaway()
        self.idle_changed()
        if grace:
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except asyncio.TimeoutError:
                pass
        tasks = [st.task for c in list(self.conns) for st in list(c.streams.values())
                 if isinstance(st.task, asyncio.Task) and not st.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for c in list(self.conns):
            c.close(NO_ERROR, "")
        await srv.wait_closed()
