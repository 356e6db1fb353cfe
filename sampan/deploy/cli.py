"""The `sampan deploy` subcommand (hooked into `sampan/cli.py`)."""
from __future__ import annotations


def _run(a) -> int:
    from . import DeployError, generate
    from ..jit.serialize import LoadError
    try:
        r = generate(a.model, a.output)
    except (DeployError, LoadError) as e:
        print(f"sampan deploy: {e}")
        return 1
    print(r.report())
    return 0


def add_parser(sub) -> None:
    d = sub.add_parser("deploy", help="write a saved program as one numpy-only Python module "
                                      "plus its weights (.npz)")
    d.add_argument("model", help="a directory written by sampan.jit.save")
    d.add_argument("-o", "--output", default="deploy", help="output directory")
    d.set_defaults(fn=_run)
