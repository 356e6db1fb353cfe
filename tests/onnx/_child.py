"""Run a measuring child script (the issue-29 memory tests: RLIMIT_AS + tracemalloc in a
fresh interpreter) and return the JSON its last line prints."""
import json
import os
import subprocess
import sys

import pytest

import sampan


def run_child(code: str) -> dict:
    if not sys.platform.startswith("linux"):
        pytest.skip("measures under RLIMIT_AS with /proc/self/status (Linux)")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sampan.__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
