"""The KServe v2 / Triton open inference protocol's request and response bodies, over
HTTP/REST, with the binary tensor data extension.

Request: a JSON object ``{"id"?, "parameters"?, "inputs": [{"name", "datatype", "shape",
"data" | "parameters": {"binary_data_size": n}}], "outputs"?: [{"name", "parameters"?:
{"binary_data": bool}}]}``. ``data`` is flat (row-major) or nested. With binary inputs
the body is the JSON header followed by the raw little-endian bytes of each binary input
in order, and the ``Inference-Header-Content-Length`` header gives the JSON's length.

Response: ``{"model_name", "model_version", "id"?, "outputs": [{"name", "datatype",
"shape", "data" | "parameters": {"binary_data_size": n}}]}``, binary outputs after the
JSON in the same way. An output is binary when its request entry asks
(``binary_data``) or, for outputs not listed, when the request's ``binary_data_output``
parameter is true. Errors: ``{"error": message}`` with the HTTP status.

Everything a request can get wrong raises `RequestError` (HTTP 400) naming the input.
"""
from __future__ import annotations

import math

import numpy as np

from . import jsonarrays, jsoncodec
from .errors import RequestError
from .model import DATATYPES

HEADER = "inference-header-content-length"
_MAX_TIMEOUT_S = 1e6    # s; a longer timeout is clamped to this (11 days is no deadline
                        # in practice, and deadline arithmetic stays far from overflow)


class Decoded:
    """A parsed request: arrays by input name, outputs wanted {name: binary?}, params."""
    __slots__ = ("id", "inputs", "outputs", "params", "binary_default", "plan")

    def __init__(self, rid, inputs, outputs, params, binary_default):
        self.id, self.inputs, self.outputs = rid, inputs, outputs
        self.params, self.binary_default = params, binary_default
        self.plan = None


def _bad(model, msg):
    return RequestError(f"model {model.name!r}: {msg}", 400)


def _shape(model, spec_name, j):
    shape = j.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _bad(model, f"input {spec_name!r}: 'shape' must be a list of non-negative "
                          f"ints; got {shape!r}")
    return tuple(shape)


def _check_shape(model, spec, shape):
    want = spec.shape
    if len(shape) != len(want) or any(w != -1 and w != d for w, d in zip(want, shape)):
        raise _bad(model, f"input {spec.name!r}: shape {list(shape)} does not fit the "
                          f"model's {list(want)} (-1: any size)")


def header_length(model, header_len):
    """The Inference-Header-Content-Length header as an int (None when absent): ASCII
    digits only (``"²".isdigit()`` is true, and ``int()`` refuses it)."""
    if header_len is None:
        return None
    s = header_len.strip()
    if not (s.isascii() and s.isdigit()) or len(s) > 18:
        raise _bad(model, f"Inference-Header-Content-Length {header_len!r:.40} is not a "
                          "non-negative decimal integer")
    return int(s)


def _check_values(model, spec, dtype, a):
    """Values the datatype cannot hold are refused, not wrapped: integers outside the
    datatype's range (JSON), booleans other than 0 or 1 (binary)."""
    if not a.size:
        return
    if dtype.kind == "b" and a.dtype != dtype:
        bad = (a != 0) & (a != 1)
        if bad.any():
            raise _bad(model, f"input {spec.name!r}: datatype BOOL needs bytes 0 or 1; got "
                              f"{int(a[bad].ravel()[0])}")
    elif dtype.kind in "iu" and a.dtype.kind in "iu" and a.dtype != dtype:
        lo, hi = a.min(), a.max()
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise _bad(model, f"input {spec.name!r}: datatype {spec.datatype} holds values "
                              f"in [{info.min}, {info.max}]; got "
                              f"{int(lo) if lo < info.min else int(hi)}")


def typed(model, spec, dtype, values):
    """JSON `values` (nested lists, or the array of them) as an array of `dtype`:
    integer and boolean datatypes take integers (or booleans) inside their range, float
    datatypes numbers whose finite values fit (a 400 naming the input otherwise). Shared
    by the v2 codec and the v1 one (`v1.py`)."""
    if dtype.kind in "iub":
        raw = np.asarray(values)
        if raw.size and raw.dtype.kind not in "iub":
            raise _bad(model, f"input {spec.name!r}: datatype {spec.datatype} needs "
                              f"{'booleans' if dtype.kind == 'b' else 'integers'}; "
                              f"the data holds {raw.dtype.name} values")
        _check_values(model, spec, dtype, raw)
        return raw.astype(dtype)
    try:
        with np.errstate(over="raise"):
            return np.array(values, dtype=dtype)
    except FloatingPointError:
        raise _bad(model, f"input {spec.name!r}: 'data' holds a finite number too "
                          f"large for datatype {spec.datatype}") from None


class _Declined(Exception):
    """The fast path of `decode` cannot give this request's values exactly: the body is
    decoded again the slow way."""


def _from_json(model, spec, dtype, shape, data, spans=None, fallback=None):
    n = math.prod(shape)
    if spans is not None:
        k = spans.index(data)
        if k is not None:           # a list `jsonarrays.split` took out of the body
            d = spans.deferred(k, spec.name, fallback, dtype, shape)
            if d is None:
                raise _Declined
            return d
    if not isinstance(data, list):
        raise _bad(model, f"input {spec.name!r}: 'data' must be a list (flat or nested); "
                          f"got {type(data).__name__}")
    try:
        a = typed(model, spec, dtype, np.asarray(data) if dtype.kind in "iub" else data)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise _bad(model, f"input {spec.name!r}: 'data' is not a regular list of numbers "
                          f"of datatype {spec.datatype}: {e}") from None
    if a.size != n:
        raise _bad(model, f"input {spec.name!r}: shape {list(shape)} needs {n} values; "
                          f"'data' has {a.size}")
    return a.reshape(shape)


class _Plan:
    """What checking one all-binary request header found, to decode the next body with
    the same header bytes without parsing it again: per input (name, dtype, shape,
    byte offset, count), and the rest of the `Decoded`."""
    __slots__ = ("inputs", "nbytes", "rid", "outputs", "params", "bdo")


_PLAN_HEADER_MAX = 4096     # longer headers are not kept (a plan is per distinct header)
_PLANS_MAX = 256            # per model; the table is emptied when it fills


def _planned(plan, blob):
    arrays = {}
    for name, dtype, shape, at, count in plan.inputs:
        a = np.frombuffer(blob, dtype, count, at)
        arrays[name] = a.reshape(shape)
    return Decoded(plan.rid, arrays, dict(plan.outputs), plan.params, plan.bdo)


def decode(model, body: bytes, header_len=None, plans=None, defer=False) -> Decoded:
    """Parse and check an infer request body against `model`'s inputs and outputs.

    `plans` (a dict the caller keeps per model) remembers what checking an all-binary
    header found, keyed by the header's bytes: a client sends the same header for every
    request of one shape (tritonclient does), and the next such body is decoded by
    slicing its binary part, skipping the JSON parse and the checks, which cannot come
    out differently for the same bytes and the same binary length.

    `defer` (the data plane's): an all-JSON body's long number lists may come back as
    `jsonarrays.Deferred` inputs, their shape and datatype checked, their values parsed
    by `jsonarrays.resolve` in the worker that runs the batch (see `_fast`)."""
    hl = header_length(model, header_len)
    if defer and hl is None and jsoncodec.backend() == "orjson":
        dec = _fast(model, body, plans)
        if dec is not None:
            return dec
    if plans is not None and hl is not None:
        plan = plans.get(body[:hl]) if 0 < hl <= _PLAN_HEADER_MAX else None
        if plan is not None and len(body) - hl == plan.nbytes:
            return _planned(plan, memoryview(body)[hl:])
    dec = jsoncodec.decode_checked(_decode, model, body, hl)
    if plans is not None and dec.plan is not None:
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[bytes(body[:hl])] = dec.plan
    return dec


class _JsonPlan:
    """What decoding one all-JSON skeleton (`jsonarrays.split`) found, every input a
    number list: per input (name, dtype, shape, span index), and the rest of the
    `Decoded`; the next body with the same skeleton needs no JSON parse at all."""
    __slots__ = ("inputs", "rid", "outputs", "params", "bdo")


def _fast(model, body, plans=None):
    """An all-JSON body decoded with its long number lists left as `jsonarrays.Deferred`
    inputs (parsed later, in a worker thread: `jsonarrays.resolve`), or None: then the
    slow path decodes it, and gives the errors. A list the parser declines decodes the
    whole body the slow way then, so its values, or its error, are the slow path's.
    `plans` keeps what a skeleton gave, as for binary headers (see `decode`)."""
    sp = jsonarrays.split(body)
    if sp is None:
        return None
    skel, spans = sp

    def fallback():
        return jsoncodec.decode_checked(_decode, model, body, None).inputs
    key = ("json", skel) if plans is not None and len(skel) <= _PLAN_HEADER_MAX else None
    plan = plans.get(key) if key is not None else None
    if plan is not None:
        arrays = {name: jsonarrays.Deferred(shape, dtype, body, *spans.at[k], name, fallback)
                  for name, dtype, shape, k in plan.inputs}
        return Decoded(plan.rid, arrays, dict(plan.outputs), plan.params, plan.bdo)
    try:
        dec = _decode(model, skel, None, spans=spans, fallback=fallback)
    except (RequestError, _Declined):
        return None
    if not spans.all_used():
        return None
    if key is not None and all(type(v) is jsonarrays.Deferred for v in dec.inputs.values()):
        plan = _JsonPlan()
        where = {se: k for k, se in enumerate(spans.at)}
        plan.inputs = tuple((n, d.dtype, d.shape, where[d.start, d.end])
                            for n, d in dec.inputs.items())
        plan.rid, plan.outputs, plan.params = dec.id, dict(dec.outputs), dec.params
        plan.bdo = dec.binary_default
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[key] = plan
    return dec


def _decode(model, body, hl, std=False, spans=None, fallback=None):
    if hl is not None:
        if not 0 < hl <= len(body):
            raise _bad(model, f"Inference-Header-Content-Length is {hl}, but the body has "
                              f"{len(body)} bytes")
        head, blob = body[:hl], memoryview(body)[hl:]
    else:
        head, blob = body, memoryview(b"")
    req = jsoncodec.loads_request(model, head, std)
    if not isinstance(req, dict):
        raise _bad(model, f"the request must be a JSON object; got {type(req).__name__}")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise _bad(model, "'parameters' must be an object")
    ins = req.get("inputs")
    if not isinstance(ins, list) or not ins:
        raise _bad(model, "the request needs a non-empty 'inputs' list")
    specs = {s.name: s for s in model.inputs}
    arrays, at = {}, 0
    layout = []           # (name, dtype, shape, offset, count) while every input is binary
    for j in ins:
        if not isinstance(j, dict) or not isinstance(j.get("name"), str):
            raise _bad(model, f"each input must be an object with a 'name'; got {j!r:.80}")
        name = j["name"]
        spec = specs.get(name)
        if spec is None:
            raise _bad(model, f"unknown input {name!r}; the model's inputs are "
                              f"{list(specs)}")
        if name in arrays:
            raise _bad(model, f"input {name!r} is given twice")
        if j.get("datatype") != spec.datatype:
            raise _bad(model, f"input {name!r}: datatype {j.get('datatype')!r}; the model "
                              f"expects {spec.datatype}")
        dtype = DATATYPES[spec.datatype]
        shape = _shape(model, name, j)
        _check_shape(model, spec, shape)
        p = j.get("parameters") or {}
        size = p.get("binary_data_size") if isinstance(p, dict) else None
        if spec.datatype == "BYTES":
            arrays[name], at = _bytes_input(model, name, shape, size, j, blob, at)
            layout = None
        elif size is not None:
            need = math.prod(shape) * dtype.itemsize
            if not isinstance(size, int) or size != need:
                raise _bad(model, f"input {name!r}: binary_data_size is {size!r}, but shape "
                                  f"{list(shape)} of {spec.datatype} needs {need} bytes")
            if at + size > len(blob):
                raise _bad(model, f"input {name!r}: binary_data_size {size} runs past the "
                                  f"end of the body ({len(blob) - at} binary bytes left)")
            le = dtype.newbyteorder("<")
            if dtype.kind == "b":
                _check_values(model, spec, dtype, np.frombuffer(blob[at:at + size], np.uint8))
            a = np.frombuffer(blob[at:at + size], dtype=le)
            arrays[name] = a.astype(dtype, copy=False).reshape(shape)
            if layout is not None and le == dtype and size:   # native little-endian
                layout.append((name, dtype, shape, at, size // max(dtype.itemsize, 1)))
            else:
                layout = None
            at += size
        elif "data" in j:
            arrays[name] = _from_json(model, spec, dtype, shape, j["data"], spans,
                                      fallback)
            layout = None
        else:
            raise _bad(model, f"input {name!r} has neither 'data' nor a binary_data_size "
                              "parameter")
    if at != len(blob):
        raise _bad(model, f"the body has {len(blob) - at} binary bytes after the inputs "
                          f"that no input's binary_data_size accounts for")
    check_complete(model, arrays)
    bdo = params.get("binary_data_output", False)
    outs = {}
    known = {s.name for s in model.outputs}
    for o in req.get("outputs") or ():
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) or \
                o["name"] not in known:
            got = o.get("name") if isinstance(o, dict) else o
            raise _bad(model, f"unknown output {got!r:.80} requested; the model's outputs are "
                              f"{sorted(known)}")
        op = o.get("parameters") or {}
        outs[o["name"]] = bool(op.get("binary_data", bdo)) if isinstance(op, dict) else bdo
    rid = req.get("id")
    dec = Decoded(rid if isinstance(rid, str) else None, arrays, outs, params, bool(bdo))
    if layout and len(head) <= _PLAN_HEADER_MAX:
        plan = _Plan()
        plan.inputs, plan.nbytes, plan.rid = tuple(layout), at, dec.id
        plan.outputs, plan.params, plan.bdo = dict(outs), params, dec.binary_default
        dec.plan = plan
    return dec


def _bytes_input(model, name, shape, size, j, blob, at):
    """A BYTES input (bytes_tensor.py) from its binary part or its JSON strings:
    (object array of bytes, the binary offset after it)."""
    from .bytes_tensor import BytesError, deserialize, from_json
    try:
        if size is None:
            if "data" not in j:
                raise _bad(model, f"input {name!r} has neither 'data' nor a "
                                  "binary_data_size parameter")
            return from_json(j["data"], shape), at
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise _bad(model, f"input {name!r}: binary_data_size must be a non-negative int; "
                              f"got {size!r}")
        if at + size > len(blob):
            raise _bad(model, f"input {name!r}: binary_data_size {size} runs past the end "
                              f"of the body ({len(blob) - at} binary bytes left)")
        return deserialize(blob[at:at + size], shape), at + size
    except BytesError as e:
        raise _bad(model, f"input {name!r} (BYTES): {e}") from None


def check_complete(model, arrays):
    """Every input of `model` is in `arrays`, and they share their first (batch) dim
    when the model batches (400 naming what is missing or which rows differ)."""
    specs = [s.name for s in model.inputs]
    missing = [n for n in specs if n not in arrays]
    if missing:
        raise _bad(model, f"missing input(s) {missing}; the model's inputs are {specs}")
    if model.max_batch_size > 0:
        rows = {n: a.shape[0] if a.ndim else None for n, a in arrays.items()}
        if len(set(rows.values())) != 1 or None in rows.values():
            raise _bad(model, f"the inputs must share their first (batch) dim; got {rows}")


def model_path(path, prefix, suffix):
    """(name, version) of ``{prefix}{name}[/versions/{v}]{suffix}``, else None. Example:
    ``model_path("/v2/models/mlp/infer", "/v2/models/", "/infer") == ("mlp", None)``"""
    if not (path.startswith(prefix) and path.endswith(suffix)):
        return None
    parts = path[len(prefix):len(path) - len(suffix)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def timeout_s(model, params):
    """A request's own timeout from its parameters: ``timeout`` (microseconds, Triton's)
    or ``timeout_ms``, at most 1e6 s; None when it gives none. A value that is not a
    positive finite number is a 400."""
    for key, scale in (("timeout_ms", 1e-3), ("timeout", 1e-6)):
        v = params.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or \
                    not math.isfinite(v):
                raise _bad(model, f"parameter {key!r} must be a positive finite number; got "
                                  f"{v!r:.40}")
            return min(float(v) * scale, _MAX_TIMEOUT_S)
    return None


def encode(model, dec: Decoded, results: dict):
    """The response body (bytes) and the JSON header length (None when all-JSON)."""
    specs = {s.name: s for s in model.outputs}
    wanted = dec.outputs or {n: dec.binary_default for n in specs}
    outs, blobs = [], []
    for name, binary in wanted.items():
        a = np.asarray(results[name])
        dt = specs[name].datatype if name in specs else None
        if dt is None or DATATYPES[dt] != a.dtype:
            from .model import datatype_of
            dt = datatype_of(a.dtype)
        o = {"name": name, "datatype": dt, "shape": list(a.shape)}
        if dt == "BYTES":
            _bytes_output(model, name, a, o, blobs, binary)
        elif binary:
            b = np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
            o["parameters"] = {"binary_data_size": len(b)}
            blobs.append(b)
        else:
            o["data"] = a.ravel()         # jsoncodec writes it as its tolist()
        outs.append(o)
    resp = {"model_name": model.name, "model_version": str(model.version), "outputs": outs}
    if dec.id is not None:
        resp["id"] = dec.id
    head = jsoncodec.dumps(resp)
    if not blobs:
        return head, None
    return b"".join([head] + blobs), len(head)


def _bytes_output(model, name, a, o, blobs, binary):
    from .bytes_tensor import BytesError, serialize, to_strings
    try:
        if binary:
            b = serialize(a)
            o["parameters"] = {"binary_data_size": len(b)}
            blobs.append(b)
        else:
            o["data"] = to_strings(a).ravel().tolist()
    except BytesError as e:
        raise RequestError(f"model {model.name!r}: output {name!r} (BYTES): {e}", 500) \
            from None


def metadata(model) -> dict:
    """``GET /v2/models/{name}``: name, versions, platform, inputs and outputs."""
    def t(s):
        return {"name": s.name, "datatype": s.datatype, "shape": [int(d) for d in s.shape]}
    out = {"name": model.name, "versions": [str(model.version)], "platform": model.platform,
           "inputs": [t(s) for s in model.inputs], "outputs": [t(s) for s in model.outputs]}
    extra = model.metadata() or {}
    for k, v in extra.items():
        out.setdefault(k, v)
    return out
