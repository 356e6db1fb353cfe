"""`sampan profile script.py [args] [-o trace.json] [--sort self_time] [--advise]`.

Runs a Python script (as ``__main__``, its folder first on ``sys.path``, ``sys.argv`` its
own arguments) under the profiler, writes the Chrome trace and prints the table of
`key_averages`, the memory peak and, with ``--advise``, the advisor's findings. The
profiler's options may come before or after the script; arguments after ``--`` all go
to the script (``sampan profile train.py -- -o model.bin``).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

_OPTS = ("-o", "--output", "--sort", "--row-limit", "--advise", "--no-memory",
         "--with-stack")


def _options(p):
    p.add_argument("-o", "--output", default="trace.json",
                   help="where to write the Chrome trace (default trace.json)")
    p.add_argument("--sort", default="self_time",
                   help="table order: self_time, total_time, calls, flops, gflops, avg_time")
    p.add_argument("--row-limit", type=int, default=25, help="rows of the table (0: all)")
    p.add_argument("--advise", action="store_true", help="print the advisor's findings")
    p.add_argument("--no-memory", action="store_true", help="do not track memory")
    p.add_argument("--with-stack", action="store_true",
                   help="record the user's source line of every eager op")


def register(subparsers) -> None:
    """Add `profile` to the `sampan` command's subparsers."""
    p = subparsers.add_parser("profile", help="run a script under the profiler: trace + table")
    _options(p)
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(fn=run)


def _split_args(a) -> None:
    """Take the profiler's own options out of the script's arguments (up to a `--`)."""
    rest = list(a.args)
    tail = []
    if "--" in rest:
        i = rest.index("--")
        rest, tail = rest[:i], rest[i + 1:]
    if any(r.split("=")[0] in _OPTS for r in rest):
        p = argparse.ArgumentParser(prog="sampan profile", add_help=False)
        _options(p)
        _, unknown = p.parse_known_args(rest, namespace=a)
        rest = unknown
    a.args = rest + tail


def run(a) -> int:
    """Profile `a.script`; returns the exit status (the script's, or 1 if it raised)."""
    from . import profile
    _split_args(a)
    script = os.path.abspath(a.script)
    if not os.path.isfile(script):
        print(f"sampan profile: no such script {a.script!r}", file=sys.stderr)
        return 2
    argv, path0 = sys.argv, list(sys.path)
    sys.argv = [script, *a.args]
    sys.path.insert(0, os.path.dirname(script))
    status = 0
    try:
        with profile(profile_memory=not a.no_memory, with_stack=a.with_stack) as prof:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                code = e.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
            except BaseException:  # noqa: BLE001 - reported after the profile is written
                traceback.print_exc()
                status = 1
    finally:
        sys.argv, sys.path[:] = argv, path0
    prof.export_chrome_trace(a.output)
    print(prof.key_averages().table(sort_by=a.sort, row_limit=a.row_limit))
    if not a.no_memory:
        print(prof.memory_timeline())
    print(f"trace: {a.output} ({len(prof.events)} events; open it in https://ui.perfetto.dev)")
    if a.advise:
        _print_advice(prof)
    return status


def _print_advice(prof) -> None:
    try:
        findings = prof.advise()
    except ImportError as e:
        print(f"advisor: not available ({e})")
        return
    if isinstance(findings, str):
        print(findings)
        return
    findings = list(findings or ())
    if not findings:
        print("advisor: no findings")
    for f in findings:
        print(f)
