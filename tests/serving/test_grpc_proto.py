"""The shipped gRPC code matches its .proto, and the .proto matches the protocol: every
message and field (name, number, type, label) is the one tritonclient ships, so that
tritonclient and other v2 clients interoperate. (tools/gen_grpc.py regenerates the code.)"""
import os
import re

import pytest

pytest.importorskip("google.protobuf")
from sampan.serving.proto import inference_pb2  # noqa: E402

PROTO = os.path.join(os.path.dirname(inference_pb2.__file__), "inference.proto")
_SCALARS = {"double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "bool": 8,
            "string": 9, "bytes": 12, "uint32": 13}


def _fields(m):
    """{field: (number, type, repeated, message/enum type name)} of a descriptor."""
    out = {}
    for f in m.fields:
        ref = f.message_type or f.enum_type
        name = ref.name if ref is not None else None
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields
            name = f"map<{k.type},{(v.message_type or v).name}>"
        out[f.name] = (f.number, f.type, f.is_repeated, name)
    return out


def _messages(fd):
    out = {}

    def walk(m, prefix):
        if m.GetOptions().map_entry:
            return
        out[prefix + m.name] = m
        for n in m.nested_types:
            walk(n, prefix + m.name + ".")
    for m in fd.message_types_by_name.values():
        walk(m, "")
    return out


def _parse_proto(text):
    """A small reader of inference.proto: {message path: {field: (number, type name,
    repeated)}} and {rpc: (request, response)}."""
    text = re.sub(r"//[^\n]*", "", text)
    msgs, rpcs, stack = {}, {}, []
    for tok in re.finditer(r"(message|enum|oneof|service)\s+(\w+)\s*\{|\}|"
                           r"rpc\s+(\w+)\s*\((\w+)\)\s*returns\s*\((\w+)\)\s*(?:\{\s*\})?|"
                           r"(repeated\s+)?(map<\s*\w+\s*,\s*\w+\s*>|\w+)\s+(\w+)\s*=\s*"
                           r"(\d+)\s*;", text):
        if tok.group(1):
            stack.append((tok.group(1), tok.group(2)))
            if tok.group(1) == "message":
                msgs[".".join(n for k, n in stack if k == "message")] = {}
        elif tok.group(0) == "}":
            stack.pop()
        elif tok.group(3):
            rpcs[tok.group(3)] = (tok.group(4), tok.group(5))
        elif stack and stack[-1][0] != "enum":
            path = ".".join(n for k, n in stack if k == "message")
            typ = re.sub(r"\s+", "", tok.group(7))
            msgs[path][tok.group(8)] = (int(tok.group(9)), typ, bool(tok.group(6)))
    return msgs, rpcs


def test_shipped_code_matches_the_proto():
    with open(PROTO, encoding="utf-8") as f:
        msgs, rpcs = _parse_proto(f.read())
    shipped = _messages(inference_pb2.DESCRIPTOR)
    assert set(shipped) == set(msgs)
    for path, fields in msgs.items():
        got = _fields(shipped[path])
        assert set(got) == set(fields), path
        for name, (number, typ, repeated) in fields.items():
            n, t, rep, ref = got[name]
            assert n == number, (path, name)
            if typ.startswith("map<"):
                assert ref is not None and ref.startswith("map<"), (path, name)
                continue
            assert rep == repeated, (path, name)
            assert (t == _SCALARS[typ]) if typ in _SCALARS else (ref == typ), (path, name)
    svc = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert svc.full_name == "inference.GRPCInferenceService"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in svc.methods} == rpcs


def test_every_message_is_the_protocols():
    """Field for field as tritonclient's own generated messages (the published protocol);
    the sampan messages may leave fields out, never add or renumber one."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    from tritonclient.grpc import model_config_pb2
    theirs = {**_messages(model_config_pb2.DESCRIPTOR), **_messages(service_pb2.DESCRIPTOR)}
    for path, m in _messages(inference_pb2.DESCRIPTOR).items():
        assert path in theirs, path
        want = _fields(theirs[path])
        for name, field in _fields(m).items():
            assert want.get(name) == field, (path, name, field, want.get(name))
    dt_ours = {v.name: v.number for v in inference_pb2.DESCRIPTOR.enum_types_by_name[
        "DataType"].values}
    dt_theirs = {v.name: v.number for v in model_config_pb2.DESCRIPTOR.enum_types_by_name[
        "DataType"].values}
    assert dt_ours == dt_theirs
    svc = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    want = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in svc.methods}
    for m in ours.methods:
        assert want[m.name] == (m.input_type.full_name, m.output_type.full_name)


def test_the_messages_live_beside_tritonclients_in_one_process():
    """The shipped messages sit in a pool of their own (tools/gen_grpc.py): importing
    tritonclient's `inference` package too does not clash, and bytes cross both ways."""
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    from google.protobuf import descriptor_pool
    assert inference_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    r = inference_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\1\2"])
    r.inputs.add(name="x", datatype="UINT8", shape=[2])
    back = service_pb2.ModelInferRequest.FromString(r.SerializeToString())
    assert back.model_name == "m" and back.inputs[0].shape == [2]
    assert back.raw_input_contents == [b"\1\2"]
