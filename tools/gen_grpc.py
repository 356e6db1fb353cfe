"""Regenerate sampan/serving/proto/inference_pb2.py and inference_pb2_grpc.py from
inference.proto (the KServe v2 / Triton gRPC protocol, as far as `sampan serve` answers it).

The runtime needs only grpcio and protobuf; the generator needs grpcio-tools, whose
bundled protoc must not be newer than the runtime's protobuf (the generated code checks
that at import). Use a throwaway environment:

    python3 -m venv /tmp/grpctools && /tmp/grpctools/bin/pip install \
        'grpcio-tools==1.81.1' 'protobuf==6.33.6'
    python tools/gen_grpc.py --protoc-python /tmp/grpctools/bin/python          # rewrite
    python tools/gen_grpc.py --protoc-python /tmp/grpctools/bin/python --check  # compare

Two edits follow protoc's output, each for a reason:
- the messages go into a descriptor pool of their own instead of protobuf's default one:
  the protocol's package is ``inference`` (its method paths must be
  ``/inference.GRPCInferenceService/...`` for clients to reach them), and tritonclient's
  generated code puts the same full names into the default pool, so both in one process
  (a test, a client beside a server) would otherwise fail with duplicate symbols;
- the service module imports the messages relatively (``from . import inference_pb2``),
  as a module of the sampan.serving.proto package.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, os.pardir, "sampan", "serving", "proto")
PROTO = "inference.proto"
OUTPUTS = ("inference_pb2.py", "inference_pb2_grpc.py")

_POOL_FROM = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_POOL_TO = ("# sampan (tools/gen_grpc.py): a pool of its own, so that tritonclient's `inference`\n"
            "# messages can share the process\n"
            "_POOL = _descriptor_pool.DescriptorPool()\n"
            "DESCRIPTOR = _POOL.AddSerializedFile(")
_IMPORT_FROM = "import inference_pb2 as inference__pb2"
_IMPORT_TO = "from . import inference_pb2 as inference__pb2"


def _edit(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"gen_grpc: protoc's {what} no longer holds {old!r} exactly once; "
                         f"update tools/gen_grpc.py for this grpcio-tools version")
    return text.replace(old, new)


def generate(protoc_python: str) -> dict:
    """{file name: text} of the two generated modules, edited (module doc)."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([protoc_python, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
                        f"--python_out={out}", f"--grpc_python_out={out}", PROTO],
                       check=True)
        texts = {}
        for name in OUTPUTS:
            with open(os.path.join(out, name), encoding="utf-8") as f:
                texts[name] = f.read()
    texts[OUTPUTS[0]] = _edit(texts[OUTPUTS[0]], _POOL_FROM, _POOL_TO, OUTPUTS[0])
    texts[OUTPUTS[1]] = _edit(texts[OUTPUTS[1]], _IMPORT_FROM, _IMPORT_TO, OUTPUTS[1])
    return texts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--protoc-python", default=sys.executable,
                    help="a Python with grpcio-tools installed (default: this one)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the shipped files differ from what protoc makes now")
    a = ap.parse_args(argv)
    texts = generate(a.protoc_python)
    stale = []
    for name, text in texts.items():
        path = os.path.join(PROTO_DIR, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            continue
        stale.append(name)
        if not a.check:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
    if a.check and stale:
        print(f"gen_grpc: {', '.join(stale)} differ from {PROTO}; rerun tools/gen_grpc.py")
        return 1
    print(f"gen_grpc: {'checked' if a.check else 'wrote'} {', '.join(texts)}"
          + (f" ({len(stale)} changed)" if not a.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
