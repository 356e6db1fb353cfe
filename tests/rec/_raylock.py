"""One local Ray cluster at a time across the suite's processes (`make test` runs two
pytest-xdist workers): two clusters starting together on two busy cores can miss Ray's
30 s raylet start-up wait (seen once in CI). A test module's cluster fixture holds this
lock from `init_ray` to `ray.shutdown`; the other worker waits for it. Re-entrant in one
process (a test that starts a second cluster while its module's is up)."""
import contextlib
import fcntl
import os
import tempfile

_HELD = [0]


@contextlib.contextmanager
def one_cluster_at_a_time():
    if _HELD[0]:
        _HELD[0] += 1
        try:
            yield
        finally:
            _HELD[0] -= 1
        return
    path = os.path.join(tempfile.gettempdir(), f"sampan-tests-ray-{os.getuid()}.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _HELD[0] = 1
        try:
            yield
        finally:
            _HELD[0] = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def start_cluster(ray, attempts: int = 4, **kwargs):
    """`init_ray(ray, **kwargs)`, tried again (up to `attempts` in all) when the raylet
    missed Ray's hard-coded 30 s start-up wait on a loaded machine (Ray's own 'timed out
    during startup': seen twice in a row in one CI run); any other error is raised."""
    import time

    from sampan.rec.remote import init_ray
    for attempt in range(1, attempts + 1):
        try:
            return init_ray(ray, **kwargs)
        except Exception as e:      # Ray raises a bare Exception for this one
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            ray.shutdown()
            time.sleep(2.0 * attempt)  # let the other worker's burst of work pass
