"""HPACK (RFC 7541) for the native gRPC front end (`grpc_native.py`): a decoder of the
header blocks a client sends, and the few literal fields the server writes.

The decoder keeps the connection's dynamic table and reads every representation
(indexed, literal with / without / never indexing, table size update, Huffman strings);
the static table and the Huffman code come from the ``hpack`` package, the walk over a
block is ours: a gRPC call's block is mostly one-byte indexed fields, and this loop reads
one in well under a microsecond where ``hpack.Decoder`` spends several. Huffman strings
that repeat call after call (``:authority``, ``user-agent``, the path) are decoded once
per connection.

The server never indexes what it writes (`literal` is "literal without indexing", no
Huffman), so its blocks need no encoder state and the constant ones are built once.

    >>> d = Decoder()
    >>> d.decode(bytes([0x82]) + literal(b"grpc-timeout", b"5S"))
    [(b':method', b'GET'), (b'grpc-timeout', b'5S')]
"""
from __future__ import annotations

from collections import deque


class HpackError(ValueError):
    """A header block that does not decode (the connection ends with COMPRESSION_ERROR)."""


def _tables():
    try:
        from hpack.huffman_table import decode_huffman
        from hpack.table import HeaderTable
    except ImportError:
        from .errors import ServingError
        raise ServingError("serving: the native gRPC front end needs the hpack package "
                           "(pip install hpack)") from None
    return tuple(HeaderTable.STATIC_TABLE), decode_huffman


_STATIC = _HUFFMAN = None


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """`value` as an HPACK integer with an N-bit prefix (`first`: the bits above it)."""
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """The field `name: value` as a literal without indexing, new name, no Huffman."""
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value


class Decoder:
    """The decoding side of one connection (its dynamic table); `decode(block)` returns
    the block's fields as [(name, value)] bytes pairs, or raises `HpackError`.

    `max_table` is the SETTINGS_HEADER_TABLE_SIZE the server advertised (a client's
    size update may not exceed it); `max_list` bounds the decoded header list (names +
    values + 32 a field, as SETTINGS_MAX_HEADER_LIST_SIZE counts)."""

    def __init__(self, max_table=4096, max_list=64 << 10):
        global _STATIC, _HUFFMAN
        if _STATIC is None:
            _STATIC, _HUFFMAN = _tables()
        self.limit = self.max_size = int(max_table)
        self.max_list = int(max_list)
        self.size = 0
        self.table: deque = deque()     # newest first: index 62 is table[0]
        self._huff: dict = {}           # Huffman bytes -> decoded, for this connection
        self.generation = 0             # bumped whenever the dynamic table changes
        self._blocks: dict = {}         # block -> (generation, fields) of blocks that
        #                                 left the table as it was (see `decode`)

    def _entry(self, index):
        if 0 < index <= 61:
            return _STATIC[index - 1]
        i = index - 62
        if index <= 0 or i >= len(self.table):
            raise HpackError(f"HPACK: index {index} is outside the static table (61) and "
                             f"the dynamic table ({len(self.table)} entries)")
        return self.table[i]

    def _add(self, name, value):
        self.generation += 1
        n = len(name) + len(value) + 32
        table = self.table
        while table and self.size + n > self.max_size:
            old = table.pop()
            self.size -= len(old[0]) + len(old[1]) + 32
        if n <= self.max_size:          # larger than the table: it empties it (7541 4.4)
            table.appendleft((name, value))
            self.size += n

    def _string(self, data, i):
        h = data[i] & 0x80
        n, i = _int(data, i, 7)
        end = i + n
        if end > len(data):
            raise HpackError(f"HPACK: a string of {n} bytes runs past the block's end")
        s = bytes(data[i:end])
        if h:
            d = self._huff.get(s)
            if d is None:
                try:
                    d = _HUFFMAN(s)
                except Exception as e:  # noqa: BLE001 -- hpack's HPACKDecodingError
                    raise HpackError(f"HPACK: a Huffman string does not decode: {e}") \
                        from None
                if len(self._huff) < 256:
                    self._huff[s] = d
            s = d
        return s, end

    def decode(self, data) -> list:
        """The fields of header block `data` (see the class doc). A block that changes
        nothing in the table (indexed fields and literals not indexed: what a client
        sends once it has indexed its headers) decodes the same until the table changes,
        so its fields are kept and given again (the caller must not modify them)."""
        data = bytes(data)
        hit = self._blocks.get(data)
        if hit is not None and hit[0] == self.generation:
            return hit[1]
        gen = self.generation
        out = self._decode(data)
        if gen == self.generation:
            if len(self._blocks) >= 64:
                self._blocks.clear()
            self._blocks[data] = (gen, out)
        return out

    def _decode(self, data) -> list:
        out, i, n, total = [], 0, len(data), 0
        try:
            while i < n:
                b = data[i]
                if b & 0x80:                            # indexed field
                    idx, i = _int(data, i, 7)
                    field = self._entry(idx)
                elif b & 0x40:                          # literal, incremental indexing
                    idx, i = _int(data, i, 6)
                    name = self._entry(idx)[0] if idx else None
                    if name is None:
                        name, i = self._string(data, i)
                    value, i = self._string(data, i)
                    field = (name, value)
                    self._add(name, value)
                elif b & 0x20:                          # dynamic table size update
                    size, i = _int(data, i, 5)
                    if size > self.limit:
                        raise HpackError(f"HPACK: table size update to {size} bytes; the "
                                         f"server allows {self.limit}")
                    self.max_size = size
                    self.generation += 1
                    self._evict()
                    continue
                else:                                   # literal, not / never indexed
                    idx, i = _int(data, i, 4)
                    name = self._entry(idx)[0] if idx else None
                    if name is None:
                        name, i = self._string(data, i)
                    value, i = self._string(data, i)
                    field = (name, value)
                total += len(field[0]) + len(field[1]) + 32
                if total > self.max_list:
                    raise HpackError(f"HPACK: the header list exceeds {self.max_list} bytes")
                out.append(field)
        except IndexError:
            raise HpackError("HPACK: the block ends inside a field") from None
        return out

    def _evict(self):
        while self.table and self.size > self.max_size:
            old = self.table.pop()
            self.size -= len(old[0]) + len(old[1]) + 32


def _int(data, i, prefix_bits):
    """(the HPACK integer at data[i] with an N-bit prefix, the index after it)."""
    mask = (1 << prefix_bits) - 1
    v = data[i] & mask
    i += 1
    if v < mask:
        return v, i
    shift = 0
    while True:
        b = data[i]
        i += 1
        v += (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
        if shift > 28:
            raise HpackError("HPACK: an integer longer than 4 continuation bytes")
