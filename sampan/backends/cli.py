"""`sampan kernels`: show or clear the kernel choice cache (backends/choice.py)."""
from __future__ import annotations

import json


def _kernels(a) -> int:
    from . import choice
    if a.clear:
        choice.clear()
        print(f"cleared {choice.cache_path()}")
        return 0
    from . import get_provider, onednn, pool, providers
    info = {"gemm_pool": (choice.stored(pool.POOL_KEY) or {}).get("winner"),
            "gemm_pool_bfloat16": (choice.stored(pool.POOL_KEY_BF16) or {}).get("winner"),
            "cache": choice.cache_path(), "machine": choice.machine_key(),
            "providers": {n: get_provider(n).available() for n in providers()},
            "cpu_flags": choice.cpu_flags(),
            "backends": {"onednn": onednn.version() if onednn.available()
                         else f"unavailable: {onednn.why_unavailable()}"},
            "choices": choice.entries()}
    print(json.dumps(info, indent=1, sort_keys=True))
    return 0


def register(subparsers) -> None:
    """Add `kernels --show | --clear` to the `sampan` command."""
    p = subparsers.add_parser("kernels", help="show or clear the measured kernel choices")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--show", action="store_true", help="print this machine's choices (default)")
    g.add_argument("--clear", action="store_true", help="delete the choice cache")
    p.set_defaults(fn=_kernels)
