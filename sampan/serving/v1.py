"""The v1 REST predict protocol (TF Serving's REST API, KServe's v1 protocol) as a codec
of the data plane: ``POST /v1/models/{m}[/versions/{v}]:predict``.

Request, one of:

- row format ``{"instances": [...]}``: one entry per row (the batch dim). For a model
  with one input an entry is that input's value for the row (or an object naming it);
  for several inputs each entry is an object ``{input name: value}`` with every input.
- columnar format ``{"inputs": ...}``: the whole batch of each input: the value itself
  for a model with one input, or an object ``{input name: value}``.

``signature_name`` is accepted and ignored (a served model has one signature). Values
are (nested) JSON lists of numbers or booleans, NaN/Infinity included, converted to the
input's datatype with the same checks as the v2 protocol (integers for integer
datatypes, in range; finite numbers that fit the float datatype).

Response: row format answers ``{"predictions": [...]}``, one entry per row: the output's
row for a model with one output, else an object ``{output name: row}``; columnar format
answers ``{"outputs": value}`` for one output, else ``{"outputs": {name: value}}``.
Errors: ``{"error": message}`` with the status (400 for a bad request).

The row format needs a batch dim: a model with ``max_batch_size`` 0 takes only the
columnar format.

    >>> # out, _ = await plane.infer("mlp", None, b'{"instances": [[0.5, 1.0]]}', codec=v1)
"""
from __future__ import annotations

import numpy as np

from . import jsoncodec
from .model import DATATYPES
from .protocol import Decoded, _bad, _check_shape, model_path, typed


class V1Decoded(Decoded):
    """A parsed v1 request: `row` is True for the row format (``instances``)."""
    __slots__ = ("row",)


def predict_path(path):
    """(name, version) of ``/v1/models/{name}[/versions/{v}]:predict``, else None.
    Example: ``predict_path("/v1/models/mlp:predict") == ("mlp", None)``"""
    return model_path(path, "/v1/models/", ":predict")


def _array(model, spec, value):
    """`value` (nested lists) as an array of `spec`'s datatype, checked."""
    if spec.datatype == "BYTES":        # strings, nested as the tensor (bytes_tensor.py)
        from .bytes_tensor import BytesError, from_json
        try:
            a = from_json(value if isinstance(value, list) else [value],
                          np.shape(np.array(value, dtype=object)))
        except (BytesError, ValueError) as e:
            raise _bad(model, f"input {spec.name!r} (BYTES): {e}") from None
        _check_shape(model, spec, a.shape)
        return a
    dtype = DATATYPES[spec.datatype]
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError, RecursionError) as e:
        raise _bad(model, f"input {spec.name!r}: not a regular (rectangular) list of "
                          f"numbers: {e}") from None
    if raw.dtype.kind not in "biuf":
        what = "values of mixed or ragged shape" if raw.dtype.kind == "O" else \
            f"{raw.dtype.name} values"
        raise _bad(model, f"input {spec.name!r}: needs numbers of datatype {spec.datatype}; "
                          f"got {what}")
    a = typed(model, spec, dtype, raw)
    _check_shape(model, spec, a.shape)
    return a


def _named(model, obj, what):
    """{input name: value} of an object naming every input of the model."""
    names = [s.name for s in model.inputs]
    if not isinstance(obj, dict):
        raise _bad(model, f"{what} must be an object {{input name: value}} naming the "
                          f"model's inputs {names}; got {type(obj).__name__}")
    unknown = [k for k in obj if k not in names]
    if unknown:
        raise _bad(model, f"{what}: unknown input(s) {unknown}; the model's inputs are "
                          f"{names}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise _bad(model, f"{what}: missing input(s) {missing}; the model's inputs are "
                          f"{names}")
    return obj


def _rows(model, instances):
    """{input name: list of per-row values} of the row format."""
    if not isinstance(instances, list) or not instances:
        raise _bad(model, "'instances' must be a non-empty list (one entry per row)")
    if model.max_batch_size <= 0:
        raise _bad(model, "the model has no batch dimension (max_batch_size 0), so it takes "
                          "no 'instances' (row format); send the columnar 'inputs'")
    names = [s.name for s in model.inputs]
    single = len(names) == 1
    if single and not all(isinstance(i, dict) for i in instances):
        return {names[0]: instances}
    cols: dict = {n: [] for n in names}
    for k, inst in enumerate(instances):
        for n, v in _named(model, inst, f"instance {k}").items():
            cols[n].append(v)
    return cols


def decode(model, body, header_len=None, plans=None) -> V1Decoded:
    """Parse and check a v1 predict body against `model`'s inputs (module doc)."""
    return jsoncodec.decode_checked(_decode, model, body)


def _decode(model, body, std=False):
    req = jsoncodec.loads_request(model, body, std)
    if not isinstance(req, dict):
        raise _bad(model, f"the request must be a JSON object; got {type(req).__name__}")
    has_rows, has_cols = "instances" in req, "inputs" in req
    if has_rows == has_cols:
        raise _bad(model, "the request needs exactly one of 'instances' (row format) or "
                          f"'inputs' (columnar format); got keys {sorted(req)}")
    if has_rows:
        values = _rows(model, req["instances"])
    else:
        ins = req["inputs"]
        names = [s.name for s in model.inputs]
        if len(names) == 1 and not (isinstance(ins, dict) and ins and
                                    set(ins) <= set(names)):
            if isinstance(ins, dict):
                raise _bad(model, f"'inputs': unknown input(s) {sorted(ins)}; the model's "
                                  f"inputs are {names}")
            values = {names[0]: ins}
        else:
            values = _named(model, ins, "'inputs'")
    arrays = {s.name: _array(model, s, values[s.name]) for s in model.inputs}
    if model.max_batch_size > 0:
        rows = {n: a.shape[0] if a.ndim else None for n, a in arrays.items()}
        if len(set(rows.values())) != 1 or None in rows.values():
            raise _bad(model, f"the inputs must share their first (batch) dim; got {rows}")
    dec = V1Decoded(None, arrays, {}, {}, False)
    dec.row = has_rows
    return dec


def encode(model, dec: V1Decoded, results: dict):
    """The response body (bytes) and None (the body is all JSON)."""
    names = [s.name for s in model.outputs]
    arrays = {n: _plain(model, n, results[n]) for n in names}
    if dec.row:
        if len(names) == 1:
            resp = {"predictions": arrays[names[0]]}
        else:
            n = len(next(iter(arrays.values())))
            resp = {"predictions": [{k: a[i] for k, a in arrays.items()} for i in range(n)]}
    elif len(names) == 1:
        resp = {"outputs": arrays[names[0]]}
    else:
        resp = {"outputs": arrays}
    return jsoncodec.dumps(resp), None


def _plain(model, name, value):
    """An output as JSON writes it: BYTES (object/str arrays) as nested strings."""
    a = np.asarray(value)
    if a.dtype.kind not in "OSU":
        return a
    from .bytes_tensor import BytesError, to_strings
    try:
        return to_strings(a)
    except BytesError as e:
        from .errors import RequestError
        raise RequestError(f"model {model.name!r}: output {name!r} (BYTES): {e}", 500) \
            from None


def model_status(plane, name, version=None) -> dict:
    """``GET /v1/models/{name}`` (KServe v1): ``{"name", "ready"}``."""
    return {"name": name, "ready": plane.model_ready(name, version)}


def models_list(plane) -> dict:
    """``GET /v1/models`` (KServe v1): ``{"models": [names]}``."""
    return {"models": sorted(plane.entries)}
