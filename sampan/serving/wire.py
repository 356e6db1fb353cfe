"""The HTTP protocol class the server hands uvicorn: uvicorn's httptools protocol whose
transport writes a response head together with the first body write after it.

uvicorn writes an ASGI ``http.response.start`` (the status line and headers) at once
and the ``http.response.body`` in a second write, so every answer cost two send
syscalls and reached the client as two TCP segments, each waking the client. `OneWrite`
holds a write that is a whole response head (``HTTP/...`` through the blank line) and
sends it joined to the next write; a callback at the end of the loop turn sends a head
still held (a response whose body comes later, a ``100 Continue``), and `close` sends
it first, so nothing is reordered or lost and nothing waits past the turn it was written
in.

    >>> from sampan.serving.wire import protocol_class
    >>> cls = protocol_class()      # None without httptools (uvicorn's "auto" then)
"""
from __future__ import annotations


class OneWrite:
    """A transport proxy for one connection (see module doc); everything but `write`,
    `writelines`, `write_eof`, `close` and `abort` goes to the real transport."""
    __slots__ = ("_tr", "_head", "_loop")

    def __init__(self, transport, loop):
        self._tr, self._head, self._loop = transport, None, loop

    def write(self, data):
        head = self._head
        if head is not None:
            self._head = None
            self._tr.write(head + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._tr.write(data)

    def flush(self):
        """Send a held response head now."""
        head, self._head = self._head, None
        if head is not None and not self._tr.is_closing():   # a lost connection: dropped
            self._tr.write(head)

    def writelines(self, lines):
        self.write(b"".join(lines))

    def write_eof(self):
        self.flush()
        self._tr.write_eof()

    def close(self):
        self.flush()
        self._tr.close()

    def abort(self):
        self._head = None
        self._tr.abort()

    def __getattr__(self, name):
        return getattr(self._tr, name)


def protocol_class():
    """uvicorn's httptools protocol with `OneWrite` transports, or None when httptools
    (or that uvicorn module) is not importable."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class OneWriteHttpTools(HttpToolsProtocol):
        def connection_made(self, transport):
            super().connection_made(OneWrite(transport, self.loop))
    return OneWriteHttpTools
