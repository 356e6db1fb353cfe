"""The gRPC front end's codec: `ModelInferRequest` -> checked arrays, outputs ->
`ModelInferResponse` (the KServe v2 / Triton gRPC messages of `proto/inference.proto`).
It is the data plane's codec for gRPC as `protocol` is for REST (``decode`` / ``encode``;
see `dataplane.py`), so both front ends check requests by the same rules and run the same
batching, admission, deadlines and metrics.

Inputs come either all typed (``contents``: the datatype's field, flattened row-major;
BOOL ``bool_contents``, INT8/16/32 ``int_contents``, INT64 ``int64_contents``, UINT8/16/32
``uint_contents``, UINT64 ``uint64_contents``, FP32 ``fp32_contents``, FP64
``fp64_contents``, BYTES ``bytes_contents``) or all raw (``raw_input_contents``, one
little-endian byte string an input, in order; BYTES as 4-byte-length-prefixed elements,
`bytes_tensor.py`; FP16 and other datatypes without a typed field travel only so). The
answer mirrors the request: raw outputs (``raw_output_contents``) for raw inputs, typed
``contents`` for typed ones, raw whenever an output's datatype has no typed field (the
protocol allows no mix); a request parameter ``raw_output`` (bool) chooses explicitly.

A gRPC deadline (the client's timeout) becomes the request's own timeout in the data
plane, so a request the client stopped waiting for is dropped from the queue (504,
DEADLINE_EXCEEDED) instead of being computed; a ``timeout``/``timeout_ms`` parameter
still applies when it is shorter.

    >>> # out = await plane.infer(req.model_name, None, req, context.time_remaining(),
    >>> #                         codec=grpc_codec)      # a ModelInferResponse
"""
from __future__ import annotations

import math

import numpy as np

from .bytes_tensor import BytesError, as_bytes_array, deserialize, from_elements, serialize
from .model import DATATYPES, datatype_of
from .protocol import Decoded, _bad, _check_shape, _check_values, check_complete, timeout_s

# datatype -> (the InferTensorContents field holding it, that field's element dtype)
TYPED = {"BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int32),
         "INT16": ("int_contents", np.int32), "INT32": ("int_contents", np.int32),
         "INT64": ("int64_contents", np.int64), "UINT8": ("uint_contents", np.uint32),
         "UINT16": ("uint_contents", np.uint32), "UINT32": ("uint_contents", np.uint32),
         "UINT64": ("uint64_contents", np.uint64), "FP32": ("fp32_contents", np.float32),
         "FP64": ("fp64_contents", np.float64),
         "BYTES": ("bytes_contents", None)}      # an object array of bytes (bytes_tensor)
_FIELDS = sorted({f for f, _ in TYPED.values()})


_PB = None


def _pb():
    global _PB
    if _PB is None:                 # imported on first use: protobuf only when serving gRPC
        from .proto import inference_pb2
        _PB = inference_pb2
    return _PB


def param_value(p):
    """The Python value of an `InferParameter` / `ModelRepositoryParameter` (None: unset)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def params_of(m) -> dict:
    return {k: param_value(v) for k, v in m.items()}


def _shape(model, name, t):
    shape = tuple(int(d) for d in t.shape)
    if any(d < 0 for d in shape):
        raise _bad(model, f"input {name!r}: shape {list(shape)} has a negative dimension")
    return shape


def _typed(model, spec, dtype, shape, contents):
    field, src = TYPED.get(spec.datatype, (None, None))
    if field is None:
        raise _bad(model, f"input {spec.name!r}: datatype {spec.datatype} has no typed "
                          "contents field; send it in raw_input_contents")
    others = [f for f in _FIELDS if f != field and len(getattr(contents, f))]
    if others:
        raise _bad(model, f"input {spec.name!r}: datatype {spec.datatype} is read from "
                          f"contents.{field}; the request fills {others}")
    values = getattr(contents, field)
    n = math.prod(shape)
    if len(values) != n:
        raise _bad(model, f"input {spec.name!r}: shape {list(shape)} needs {n} values; "
                          f"contents.{field} has {len(values)}")
    if src is None:                 # BYTES
        return from_elements(values, shape)
    a = np.fromiter(values, src, count=n) if n else np.zeros(0, src)
    _check_values(model, spec, dtype, a)
    return a.astype(dtype, copy=False).reshape(shape)


def _raw(model, spec, dtype, shape, raw):
    if spec.datatype == "BYTES":
        try:
            return deserialize(raw, shape)
        except BytesError as e:
            raise _bad(model, f"input {spec.name!r} (BYTES): raw_input_contents: {e}") \
                from None
    need = math.prod(shape) * dtype.itemsize
    if len(raw) != need:
        raise _bad(model, f"input {spec.name!r}: raw_input_contents holds {len(raw)} bytes, "
                          f"but shape {list(shape)} of {spec.datatype} needs {need}")
    if dtype.kind == "b":
        _check_values(model, spec, dtype, np.frombuffer(raw, np.uint8))
    a = np.frombuffer(raw, dtype.newbyteorder("<"))
    return a.astype(dtype, copy=False).reshape(shape)


def decode(model, req, deadline_s=None, plans=None) -> Decoded:
    """Check a `ModelInferRequest` (or its serialized bytes) against `model`'s inputs and
    outputs; `deadline_s`: the seconds the gRPC call has left (None: no deadline)."""
    if isinstance(req, (bytes, bytearray, memoryview)):
        try:
            req = _pb().ModelInferRequest.FromString(bytes(req))
        except Exception as e:  # noqa: BLE001 -- protobuf's DecodeError
            raise _bad(model, f"the request is not a ModelInferRequest: {e}") from None
    if not req.inputs:
        raise _bad(model, "the request needs at least one input")
    raw = req.raw_input_contents
    if raw and len(raw) != len(req.inputs):
        raise _bad(model, f"raw_input_contents has {len(raw)} entries for "
                          f"{len(req.inputs)} inputs (one an input, in order)")
    specs = {s.name: s for s in model.inputs}
    arrays = {}
    for i, t in enumerate(req.inputs):
        spec = specs.get(t.name)
        if spec is None:
            raise _bad(model, f"unknown input {t.name!r}; the model's inputs are "
                              f"{list(specs)}")
        if t.name in arrays:
            raise _bad(model, f"input {t.name!r} is given twice")
        if t.datatype != spec.datatype:
            raise _bad(model, f"input {t.name!r}: datatype {t.datatype!r}; the model "
                              f"expects {spec.datatype}")
        dtype = DATATYPES[spec.datatype]
        shape = _shape(model, t.name, t)
        _check_shape(model, spec, shape)
        if raw:
            if t.HasField("contents"):
                raise _bad(model, f"input {t.name!r} has contents while the request sends "
                                  "raw_input_contents (all inputs one way or the other)")
            arrays[t.name] = _raw(model, spec, dtype, shape, raw[i])
        else:
            arrays[t.name] = _typed(model, spec, dtype, shape, t.contents)
    check_complete(model, arrays)
    known = {s.name for s in model.outputs}
    outs = {}
    for o in req.outputs:
        if o.name not in known:
            raise _bad(model, f"unknown output {o.name!r} requested; the model's outputs "
                              f"are {sorted(known)}")
        outs[o.name] = True
    params = params_of(req.parameters) if req.parameters else {}
    want_raw = params.pop("raw_output", None)
    if want_raw is None:
        want_raw = bool(raw)
    if deadline_s is not None:
        own = timeout_s(model, params)
        params.pop("timeout", None)
        if deadline_s <= 0:
            from .errors import RequestError
            raise RequestError(f"model {model.name!r}: the call's deadline passed before "
                               "the request was read", 504)
        params["timeout_ms"] = 1e3 * (deadline_s if own is None else min(own, deadline_s))
    return Decoded(req.id or None, arrays, outs, params, bool(want_raw))


def encode(model, dec: Decoded, results: dict):
    """The `ModelInferResponse` of `results` (raw or typed, see the module doc)."""
    pb = _pb()
    names = list(dec.outputs) or [s.name for s in model.outputs]
    arrays = [np.asarray(results[n]) for n in names]
    dts = [datatype_of(a.dtype) for a in arrays]
    raw = dec.binary_default or any(dt not in TYPED for dt in dts)
    resp = pb.ModelInferResponse(model_name=model.name, model_version=str(model.version),
                                 id=dec.id or "")
    for name, a, dt in zip(names, arrays, dts):
        o = resp.outputs.add(name=name, datatype=dt, shape=a.shape)
        if dt == "BYTES":
            try:
                b = as_bytes_array(a)
            except BytesError as e:
                from .errors import RequestError
                raise RequestError(f"model {model.name!r}: output {name!r} (BYTES): {e}",
                                   500) from None
            if raw:
                resp.raw_output_contents.append(serialize(b))
            else:
                o.contents.bytes_contents.extend(b.ravel().tolist())
        elif raw:
            resp.raw_output_contents.append(
                np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes())
        else:
            getattr(o.contents, TYPED[dt][0]).extend(a.ravel().tolist())
    return resp
