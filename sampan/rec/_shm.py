"""A same-host shared-memory arena for the arrays of remote shard calls.

Ray passes a call's arrays either inline in the task's RPC or through its object store.
Profiled on W4 (``benchmarks/ray_ps_profile.py``), both cost far more CPU than the bytes:
inline, a 0.6 MB push costs ~1.1 ms in the actor and ~1.7 ms in the trainer (several
copies through gRPC and protobuf); through the store, each object costs IPC rounds with
the raylet (5.7 ms of raylet CPU a step). When a shard actor runs on the trainer's host,
the arrays instead go through one anonymous memory file (``memfd``) per shard that both
map: the trainer copies a push's ids and gradients, and a pull's ids, into it and sends
their place (a :class:`Slot`), and a pull's answer is written by the actor straight into
a place the trainer reserved. The call itself still goes through Ray.

The trainer owns the memory: it allocates and frees slots (a ring, freed in any order),
the actor opens the file through ``/proc/<pid>/fd/<fd>`` and checks a random token, so an
actor on another host (or a restarted one that cannot open it) says so and the arrays go
inline. The file disappears with the trainer process. A slot is freed only once its call
has answered, so an actor (or Ray's retry of the call on a restarted actor) never reads
or writes a slot that was given to another call.
"""

from __future__ import annotations

import collections
import mmap
import os
import secrets
import threading
from dataclasses import dataclass

import numpy as np

_HEADER = 64       # the token lives here; slots start after it
_ALIGN = 64
MIN_BYTES = 16 << 10  # smaller arrays stay inline (a slot costs more than they do)


@dataclass(frozen=True)
class Slot:
    """Where an array lies in an arena: byte offset, dtype string and shape."""

    offset: int
    dtype: str
    shape: tuple

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


class Arena:
    """The trainer's side: one memory file, slots allocated as a ring.

    >>> a = Arena(1 << 20); s = a.put(np.arange(4096.0)); float(a.view(s)[-1])
    4095.0
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.fd = os.memfd_create("sampan-shard-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.nbytes)
        self._map = mmap.mmap(self.fd, self.nbytes)
        self.buf = np.frombuffer(self._map, np.uint8)
        self.token = secrets.token_bytes(16)
        self.buf[:16] = np.frombuffer(self.token, np.uint8)
        self._live: collections.OrderedDict = collections.OrderedDict()  # offset -> end
        self._freed: set = set()
        self._lock = threading.Lock()

    def handle(self) -> tuple:
        """What an actor needs to open this arena (see :func:`attach`)."""
        return (os.getpid(), self.fd, self.nbytes, self.token)

    def alloc(self, nbytes: int) -> int | None:
        """Offset of ``nbytes`` free bytes, or None when the ring has no room."""
        size = -(-int(nbytes) // _ALIGN) * _ALIGN
        with self._lock:
            if not self._live:
                off = _HEADER if _HEADER + size <= self.nbytes else None
            else:
                first = next(iter(self._live))
                last = next(reversed(self._live))
                end = self._live[last]
                if last >= first:  # live bytes in one run: room after it, or at the front
                    off = end if end + size <= self.nbytes else (
                        _HEADER if _HEADER + size <= first else None)
                else:              # wrapped: room between the newest and the oldest
                    off = end if end + size <= first else None
            if off is not None:
                self._live[off] = off + size
            return off

    def free(self, offset: int) -> None:
        """Give a slot back (in any order; the ring reclaims from its oldest end)."""
        with self._lock:
            self._freed.add(offset)
            while self._live and next(iter(self._live)) in self._freed:
                self._freed.discard(self._live.popitem(last=False)[0])

    def view(self, slot: Slot) -> np.ndarray:
        """The array a slot holds (a view into the arena)."""
        return np.ndarray(slot.shape, np.dtype(slot.dtype), self.buf, slot.offset)

    def reserve(self, dtype, shape) -> Slot | None:
        """A slot for an array of this dtype and shape, or None (no room)."""
        dt = np.dtype(dtype)
        off = self.alloc(dt.itemsize * int(np.prod(shape, dtype=np.int64)))
        return None if off is None else Slot(off, dt.str, tuple(int(d) for d in shape))

    def put(self, a: np.ndarray) -> Slot | None:
        """Copy ``a`` into a new slot; None when there is no room."""
        slot = self.reserve(a.dtype, a.shape)
        if slot is not None:
            self.view(slot)[...] = a
        return slot

    def close(self) -> None:
        self.buf = None
        try:
            self._map.close()
        except BufferError:  # a view is still alive; the mapping goes with it
            pass
        os.close(self.fd)


def attach(handle) -> np.ndarray | None:
    """The actor's side: the arena's bytes, or None when it is not reachable from here
    (another host, another user, or the trainer is gone)."""
    pid, fd, nbytes, token = handle
    try:
        f = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(f).st_size != nbytes:
            return None
        buf = np.frombuffer(mmap.mmap(f, nbytes), np.uint8)
    except (OSError, ValueError):
        return None
    finally:
        os.close(f)
    return buf if bytes(buf[:16]) == token else None


def view(buf: np.ndarray, slot: Slot) -> np.ndarray:
    """The actor's view of a slot."""
    if slot.offset < _HEADER or slot.offset + slot.nbytes > buf.size:
        raise ValueError(f"arena slot {slot} lies outside the {buf.size}-byte arena")
    return np.ndarray(slot.shape, np.dtype(slot.dtype), buf, slot.offset)


def new_arena(nbytes: int) -> Arena | None:
    """An arena, or None where memory files are not available (arrays then go inline)."""
    try:
        return Arena(nbytes)
    except (AttributeError, OSError):
        return None


def encode(arena: Arena, args: tuple, answer=None):
    """``(wire, slots, out)``: a call's arguments with their large arrays copied into
    arena slots (those that find no room stay inline), plus, for ``answer`` (a float32
    shape), a slot reserved for the answer, passed last as ``out``."""
    wire, slots = [], []
    for a in args:
        if isinstance(a, np.ndarray) and a.nbytes >= MIN_BYTES:
            slot = arena.put(a)
            if slot is not None:
                slots.append(slot)
                a = slot
        wire.append(a)
    out = None
    if answer is not None and 4 * answer[0] * answer[1] >= MIN_BYTES:
        out = arena.reserve(np.float32, answer)
        if out is not None:
            slots.append(out)
            wire.append(out)
    return tuple(wire), slots, out
