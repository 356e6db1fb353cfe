"""sampan's allocation policy (sampan/_alloc.py): applied on glibc at import, skipped
when the user opts out or sets glibc's own variables."""
import os
import subprocess
import sys

import pytest

CODE = "import sampan._alloc as a, sampan; print(a.applied)"


def _run(**env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "SAMPAN_MALLOC"))}
    e.update(env)
    return subprocess.run([sys.executable, "-c", CODE], env=e, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc policy")
def test_policy_applied_and_opt_outs():
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").gnu_get_libc_version
    except (OSError, AttributeError):
        pytest.skip("not glibc")
    assert _run() == "True"
    assert _run(SAMPAN_MALLOC="system") == "False"
    assert _run(MALLOC_TRIM_THRESHOLD_="131072") == "False"
