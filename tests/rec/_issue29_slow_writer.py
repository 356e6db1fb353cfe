"""A Ray worker setup hook (``runtime_env={"worker_process_setup_hook": ...}``) for the
issue 29 tests: every snapshot file a shard actor writes takes SLOW_S longer, so a close
that does not wait for its writers always finds them busy."""
import time

SLOW_S = 0.3


def install():
    from sampan.rec import _server
    write = _server._write_atomic

    def slow(path, header, arrays):
        time.sleep(SLOW_S)
        write(path, header, arrays)

    _server._write_atomic = slow
