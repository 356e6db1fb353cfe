#!/usr/bin/env python
"""Write or check API.spec: one line per public name with its inspect signature.

    python tools/api_spec.py --write    # regenerate API.spec
    python tools/api_spec.py --check    # fail (exit 1) with a diff when the API changed

Public = every name in the `__all__` of a sampan module whose dotted path has no
component starting with "_". Classes also list their public methods and properties.
Names under sampan.experimental are marked [unstable]. Docstrings are not part of
the spec (a doc edit never fails CI)."""
from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import pkgutil
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "API.spec")
sys.path.insert(0, ROOT)


def _sig(obj) -> str:
    try:
        s = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return re.sub(r" at 0x[0-9a-f]+", "", s)


def _modules():
    import sampan
    yield sampan
    for info in pkgutil.walk_packages(sampan.__path__, "sampan."):
        if any(p.startswith("_") for p in info.name.split(".")):
            continue
        try:
            mod = importlib.import_module(info.name)
        except Exception as e:  # an optional extra that is not installed
            print(f"api_spec: skipping {info.name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        yield mod


def spec_lines() -> list[str]:
    lines = []
    for mod in _modules():
        names = getattr(mod, "__all__", None)
        if not names:
            continue
        tag = " [unstable]" if mod.__name__.startswith("sampan.experimental") else ""
        for name in sorted(names):
            obj = getattr(mod, name, None)
            full = f"{mod.__name__}.{name}"
            if inspect.isclass(obj):
                lines.append(f"{full}: class{_sig(obj)}{tag}")
                for mname, m in sorted(vars(obj).items()):
                    if mname.startswith("_") and mname not in ("__call__", "__init__"):
                        continue
                    if isinstance(m, property):
                        lines.append(f"{full}.{mname}: property{tag}")
                    elif isinstance(m, (staticmethod, classmethod)):
                        lines.append(f"{full}.{mname}: method{_sig(m.__func__)}{tag}")
                    elif inspect.isfunction(m):
                        lines.append(f"{full}.{mname}: method{_sig(m)}{tag}")
            elif callable(obj):
                lines.append(f"{full}: function{_sig(obj)}{tag}")
            elif inspect.ismodule(obj):
                lines.append(f"{full}: module{tag}")
            elif isinstance(obj, np.dtype):
                # a dtype's class name differs between numpy and ml_dtypes releases
                lines.append(f"{full}: dtype({obj.name}){tag}")
            else:
                lines.append(f"{full}: {type(obj).__name__}{tag}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = "\n".join(spec_lines()) + "\n"
    if args.write:
        tmp = SPEC + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, SPEC)
        print(f"wrote {SPEC} ({text.count(chr(10))} lines)")
        return 0
    old = open(SPEC).read() if os.path.exists(SPEC) else ""
    if old == text:
        print(f"API.spec is current ({text.count(chr(10))} lines)")
        return 0
    diff = difflib.unified_diff(old.splitlines(), text.splitlines(), "API.spec (checked in)",
                                "API (live)", lineterm="", n=0)
    print("\n".join(diff))
    print("\nThe public API differs from API.spec. If the change is intended, regenerate it:\n"
          "    make api-spec     (or: .venv/bin/python tools/api_spec.py --write)\n"
          "and review the diff above in your commit.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
