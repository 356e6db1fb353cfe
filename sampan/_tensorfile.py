"""The safetensors layout, streamed: arrays written straight from their buffers and read
straight into their own (writable) arrays, hashing the bytes on the way.

Checkpoints (`sampan.save`) and saved programs (`sampan.jit.save`) both keep their
arrays in this layout, so both read a file once, in order, with no full-file buffer:
the safetensors library's `serialize` returns a copy of every array and `deserialize`
another, which made a load peak at three times the file size.

The layout (https://github.com/huggingface/safetensors, stable since 0.3)::

    8 bytes   N, uint64 little-endian
    N bytes   JSON: {name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
                     "__metadata__": {str: str}}, padded with spaces to a multiple of 8
    rest      the arrays' bytes, little-endian, C order; offsets relative to here

A reader checks the header before it allocates anything: the dtypes are known, every
array's byte length is its shape's, and the offsets tile the data exactly (no gap, no
overlap), so a corrupt header can never make it allocate more than the file holds.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np

# numpy dtype name <-> safetensors dtype code
CODES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "uint32": "U32", "int32": "I32", "uint64": "U64", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "complex64": "C64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_NAMES = {v: k for k, v in CODES.items()}
MAX_HEADER = 100 << 20   # the safetensors library's own limit on N


def np_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def contiguous(a: np.ndarray) -> np.ndarray:
    """`a` as a C-contiguous little-endian array of the same shape.

    Not `np.ascontiguousarray`: it returns a 0-d array as shape (1,), which is how a
    BatchNorm's `num_batches_tracked` came back from a checkpoint as (1,) and no longer
    fitted its layer."""
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    return a


def _bytes_of(a: np.ndarray) -> memoryview:
    # reshape(-1) first: a 0-d array cannot change its dtype to uint8 in place
    return memoryview(a.reshape(-1).view(np.uint8))


def header_bytes(arrays: dict, metadata: dict | None = None) -> bytes:
    """The length prefix and JSON header for `arrays` (name -> contiguous array), laid
    out in the dict's order."""
    head, off = {}, 0
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in arrays.items():
        if a.dtype.name not in CODES:
            raise TypeError(f"dtype {a.dtype} cannot be stored (array '{name}')")
        head[name] = {"dtype": CODES[a.dtype.name], "shape": list(a.shape),
                      "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(head, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(f, arrays: dict, metadata: dict | None = None, hasher=None) -> int:
    """Write `arrays` (name -> C-contiguous little-endian array, see `contiguous`) to the
    binary file `f`; feeds every byte written to `hasher` if given; returns the count."""
    head = header_bytes(arrays, metadata)
    f.write(head)
    if hasher is not None:
        hasher.update(head)
    n = len(head)
    for a in arrays.values():
        if a.nbytes:
            mv = _bytes_of(a)
            f.write(mv)
            if hasher is not None:
                hasher.update(mv)
            n += a.nbytes
    return n


def _read_exact(f, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise EOFError(f"needed {n} bytes, the file had {len(b)}")
    return b


def read(f, nbytes: int, error, where: str, hasher=None) -> tuple[dict, dict]:
    """Read `nbytes` of safetensors layout from the binary file `f` (at its start):
    returns (name -> array, metadata). Each array is allocated once, at its final shape,
    and the file's bytes are read into it; every byte read goes to `hasher`. Anything
    malformed raises `error(f"{where}: ...")`; a short file says "truncated"."""
    def bad(msg):
        return error(f"{where}: {msg}")

    if nbytes < 8:
        raise bad(f"the tensor data is truncated ({nbytes} bytes, not even a header)")
    try:
        prefix = _read_exact(f, 8)
        (hlen,) = struct.unpack("<Q", prefix)
        if hlen > min(MAX_HEADER, nbytes - 8):
            raise bad(f"the tensor header claims {hlen} bytes; the data has {nbytes - 8} "
                      "after its length field: the file is truncated or corrupt")
        raw = _read_exact(f, hlen)
    except EOFError as e:
        raise bad(f"the file is truncated ({e})") from None
    if hasher is not None:
        hasher.update(prefix)
        hasher.update(raw)
    try:
        head = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"the tensor header is not valid JSON ({e}); the file is corrupt") from None
    if not isinstance(head, dict):
        raise bad("the tensor header is not a JSON object; the file is corrupt")
    meta = head.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise bad("the tensor header's __metadata__ is not an object; the file is corrupt")
    specs = []
    for name, e in head.items():
        try:
            code, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
            dt = np_dtype(_NAMES[code])
            ok = (isinstance(shape, list)
                  and all(type(d) is int and d >= 0 for d in shape)
                  and type(b) is int and type(end) is int and 0 <= b <= end)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise bad(f"the tensor header's entry for '{name}' is malformed ({e!r}); "
                      "the file is corrupt")
        if end - b != math.prod(shape) * dt.itemsize:
            raise bad(f"array '{name}' is {code}{shape} ({math.prod(shape) * dt.itemsize} "
                      f"bytes) but spans {end - b} bytes; the file is corrupt")
        specs.append((b, end, name, dt, tuple(shape)))
    specs.sort(key=lambda s: (s[0], s[1]))
    data_len, at = nbytes - 8 - hlen, 0
    for b, end, name, _, _ in specs:
        if b != at:
            raise bad(f"array '{name}' starts at byte {b} of the data, expected {at} (the "
                      "arrays must tile the data); the file is corrupt")
        at = end
    if at != data_len:
        what = "truncated" if at > data_len else "corrupt"
        raise bad(f"the file is {what}: its arrays need {at} bytes of data, it holds {data_len}")
    out = {}
    for b, end, name, dt, shape in specs:
        a = np.empty(shape, dt)
        if a.nbytes:
            mv = _bytes_of(a)
            got = 0
            while got < a.nbytes:
                k = f.readinto(mv[got:])
                if not k:
                    raise bad(f"the file is truncated inside array '{name}'")
                got += k
            if hasher is not None:
                hasher.update(mv)
        out[name] = a
    return out, meta
