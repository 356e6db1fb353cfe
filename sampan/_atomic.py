"""Temporary files and folders that publish atomically, and the cleaning up after saves
that were killed half way: the one temporary-file policy of every writer (checkpoints,
saved programs, embedding snapshots, traces, caches).

A file is written to `.<name>.<token>.tmp` beside it (`write_file`), a folder to
`<name>.tmp-<token>` (`create_dir`, `publish_dir`); each is fsynced, then renamed into
place. The writer holds an exclusive `flock` on that temporary for as long as it lives,
so a later save can tell a temporary left by a dead process (its lock is free: the
kernel drops a process's locks when it dies) from one another process is still writing,
and remove only the former. Where `fcntl` is missing (Windows), a temporary counts as
left over once it is an hour old. Temporaries named `<name>.tmp-<pid>[-<n>]`, by
writers that took no lock, are removed once that process has ended
(`remove_dead_pid_temps`).

A reader of a published folder (`sampan.jit.serialize.read`) holds a shared `flock` on
it while it opens its files: a save that replaces the folder then leaves the old one
(under its temporary name) for the next save's cleanup instead of removing files the
reader is about to open.

New files are created with mode 0o666 and folders with 0o777, less the umask, as `open`
and `mkdir` would: `tempfile.mkstemp` makes every checkpoint 0o600 whatever the umask.
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import sys
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

STALE_AGE_S = 3600.0   # without fcntl: a temporary this old belongs to no live save


def token() -> str:
    return secrets.token_hex(8)


def lock(fd: int) -> bool:
    """Take an exclusive lock on `fd` without waiting; False if another process holds it."""
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except (BlockingIOError, PermissionError):
        return False
    except OSError:   # a filesystem without locks: treat every temporary as live
        return False


def lock_shared(fd: int, wait_s: float = 1.0) -> bool:
    """Take a shared lock on `fd` (a reader's), waiting up to `wait_s` while a writer
    holds it exclusively; False if it could not (or locks are missing here)."""
    if fcntl is None:  # pragma: no cover
        return False
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except (BlockingIOError, PermissionError):
            if time.monotonic() >= end:
                return False
            time.sleep(0.001)
        except OSError:   # a filesystem without locks
            return False


def _same(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def create_file(folder: str, name_of) -> tuple[int, str]:
    """Create and lock a new file `folder/name_of(token)`: returns (fd, path)."""
    while True:
        path = os.path.join(folder, name_of(token()))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o666)
        # a cleaner may have taken it for a dead save's between the open and the lock
        if lock(fd) and _same(path, fd):
            return fd, path
        os.close(fd)


def create_dir(folder: str, name_of) -> tuple[int | None, str]:
    """Create and lock a new folder `folder/name_of(token)`: returns (fd or None, path);
    keep the fd open while the folder is in use (the lock lives on it)."""
    while True:
        path = os.path.join(folder, name_of(token()))
        os.mkdir(path, 0o777)
        fd = open_dir(path)
        if fd is None or (lock(fd) and _same(path, fd)):
            return fd, path
        os.close(fd)


def open_dir(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:   # pragma: no cover - platforms that cannot open a folder
        return None


def lock_dir(path: str) -> int | None | bool:
    """Lock an existing folder: its fd, None where folders cannot be locked, False when
    another live process holds it (or it is gone)."""
    fd = open_dir(path)
    if fd is None:
        return None if os.path.isdir(path) else False
    if lock(fd):
        return fd
    os.close(fd)
    return False


def release(fd) -> None:
    if type(fd) is int:   # not None, not False
        os.close(fd)


def is_stale(path: str) -> tuple[bool, int | None]:
    """(left over by a dead save?, the fd holding its lock when True, to release later)."""
    if fcntl is None:  # pragma: no cover
        try:
            return time.time() - os.stat(path).st_mtime > STALE_AGE_S, None
        except OSError:
            return False, None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False, None
    if lock(fd):
        return True, fd
    os.close(fd)
    return False, None


def remove_stale(folder: str, pattern: str, keep=(), where=None) -> list[str]:
    """Remove the entries of `folder` whose name fully matches the regex `pattern` and
    that no live save holds; returns the names removed. `where(match, path)`, when
    given, must also hold for an entry to go."""
    rx = re.compile(pattern)
    gone = []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for n in names:
        m = rx.fullmatch(n)
        if not m or n in keep:
            continue
        p = os.path.join(folder, n)
        if where is not None and not where(m, p):
            continue
        stale, fd = is_stale(p)
        if not stale:
            continue
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
            gone.append(n)
        except OSError:
            pass
        finally:
            release(fd)
    return gone


def fsync_dir(folder: str) -> None:
    """Make renames inside `folder` durable; a no-op where folders cannot be opened."""
    fd = open_dir(folder)
    if fd is None:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- folders
# A folder cannot be renamed over a non-empty one. On Linux, renameat2(RENAME_EXCHANGE)
# swaps the new folder and the old one in one atomic step, so a reader sees one or the
# other, never neither. Elsewhere (or on a filesystem without it) publishing takes two
# renames: the old folder aside to `<name>.old-<token>`, the new one from
# `<name>.tmp-<token>` into place. A crash between them leaves both (same token) and
# nothing at `<name>`; `recover_dir` (run by the loader and the next save) finishes the
# job from what is on disk.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = []


def exchange(a: str, b: str) -> bool:
    """Swap the paths `a` and `b` atomically; False where the platform cannot."""
    if not sys.platform.startswith("linux"):
        return False
    if not _renameat2:
        import ctypes
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
        except (AttributeError, OSError):   # a libc older than glibc 2.28
            fn = None
        _renameat2.append(fn)
    fn = _renameat2[0]
    if fn is None:
        return False
    import ctypes
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV):
        return False   # this kernel or filesystem cannot: two renames instead
    raise OSError(err, os.strerror(err), a)


def dir_temp_pattern(base: str) -> str:
    """Regex of the temporaries and set-aside copies of folder `base` (any save)."""
    return re.escape(base) + r"\.(tmp|old)-(?:[0-9a-f]{8}|[0-9a-f]{16})"


def publish_dir(tmp: str, path: str) -> None:
    """Move the complete, fsynced, locked folder `tmp` (named `<path>.tmp-<token>`) to
    `path`, replacing a folder there: in one step where `exchange` can, else in two
    renames. On an exception between those the old folder is put back when possible; a
    crash there is repaired by `recover_dir`."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    head, name = os.path.split(os.path.abspath(tmp))
    old = os.path.join(head, name.replace(".tmp-", ".old-"))   # the same token
    old_fd, moved = None, False
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            if exchange(tmp, path):   # `tmp` now names the old folder
                fsync_dir(folder)
                _remove_unread(tmp)
                return
            old_fd = lock_dir(path)
            os.replace(path, old)
            moved = True
            fsync_dir(folder)
        os.replace(tmp, path)
        fsync_dir(folder)
    except BaseException:
        if moved:
            try:
                os.replace(old, path)   # put the old folder back
                moved = False
                fsync_dir(folder)
            except BaseException:  # noqa: BLE001, S110 - recover_dir repairs it later
                pass
        if not moved:   # otherwise `tmp` is the new program, wanted by recover_dir
            shutil.rmtree(tmp, ignore_errors=True)
        release(old_fd)
        raise
    if moved and old_fd is not False:   # False: a reader holds it (see _remove_unread)
        shutil.rmtree(old, ignore_errors=True)
    release(old_fd)


def _remove_unread(old: str) -> None:
    """Remove the replaced folder `old` unless a reader holds it (a shared lock, as
    `sampan.jit.serialize.read` takes): its files must stay until that reader has opened
    them; the next save's `remove_stale` removes it once it is free."""
    fd = lock_dir(old)
    if fd is False:
        return
    try:
        shutil.rmtree(old, ignore_errors=True)
    finally:
        release(fd)


def replacing(path: str) -> bool:
    """Whether a live save is between the two renames that publish folder `path`: its
    `<path>.old-<token>` set aside and its `<path>.tmp-<token>`, held, not yet in place
    (a reader waits for the new folder)."""
    folder, base = os.path.split(os.path.abspath(path))
    rx = re.compile(re.escape(base) + r"\.old-([0-9a-f]{16})")
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for n in names:
        m = rx.fullmatch(n)
        if m:
            stale, fd = is_stale(os.path.join(folder, f"{base}.tmp-{m.group(1)}"))
            release(fd)
            if not stale and os.path.isdir(os.path.join(folder, f"{base}.tmp-{m.group(1)}")):
                return True
    return False


def recover_dir(path: str, complete) -> bool:
    """If `path` is missing because a save died between its two renames, move the new
    folder into place (or the old one, when `complete(folder)` says the new one is not
    whole). Folders a live save holds are left alone. Returns True when it moved one."""
    if os.path.exists(path):
        return False
    folder, base = os.path.split(os.path.abspath(path))
    rx = re.compile(re.escape(base) + r"\.(tmp|old)-([0-9a-f]{16})")
    pairs: dict = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for n in names:
        m = rx.fullmatch(n)
        if m:
            pairs.setdefault(m.group(2), {})[m.group(1)] = os.path.join(folder, n)
    # only a pair proves a save stopped between its renames: a lone `.old-` means the
    # new folder was published, and `path` was removed afterwards on purpose
    for _, p in sorted(pairs.items(), key=lambda kv: -_mtime(kv[1].get("tmp"))):
        if set(p) != {"tmp", "old"}:
            continue
        fds = [lock_dir(p["tmp"]), lock_dir(p["old"])]
        try:
            if any(fd is False for fd in fds):   # a live save holds one
                continue
            src = p["tmp"] if complete(p["tmp"]) else p["old"] if complete(p["old"]) else None
            if src is None:
                continue
            try:
                os.replace(src, path)
            except OSError:
                return os.path.exists(path)   # another process recovered it first
            fsync_dir(folder)
            shutil.rmtree(p["old"] if src == p["tmp"] else p["tmp"], ignore_errors=True)
            return True
        finally:
            for fd in fds:
                release(fd)
    return False


def _mtime(p) -> float:
    try:
        return os.stat(p).st_mtime
    except (OSError, TypeError):
        return 0.0


def _temp_name(base: str, tok: str) -> str:
    return f".{base}.{tok}.tmp"


def file_temp_pattern(base: str | None = None) -> str:
    """Regex of the temporaries `write_file` makes for file `base` (of any file: None)."""
    return (r"\." + (".+" if base is None else re.escape(base))
            + r"\.[0-9a-f]{16}\.tmp")


# Writers before this module named a temporary `<name>.tmp-<pid>[-<thread>]` and held
# no lock on it; one killed half way left a file as large as what it wrote, for good.
LEGACY_PID_TEMP = r".+\.tmp-(?P<pid>[0-9]+)(?:-[0-9]+)?"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie has ended)."""
    if pid <= 0:
        return True   # not a process: never take its file for a dead writer's
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):   # not ours to signal, or no pid at all
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def remove_dead_pid_temps(folder: str, pattern: str = LEGACY_PID_TEMP) -> list[str]:
    """Remove the files of `folder` whose name fully matches `pattern` (a regex with a
    `pid` group) when that process has ended and no one holds the file's lock."""
    def dead_writers_file(m, p):
        return (not pid_alive(int(m.group("pid")))
                and not (os.path.isdir(p) and not os.path.islink(p)))
    return remove_stale(folder, pattern, where=dead_writers_file)


def sweep_temps(folder: str) -> list[str]:
    """Remove the temporaries every dead writer left in `folder`, whatever file each was
    for: a folder of files with changing names (snapshot chains) never writes the same
    name twice, so `write_file`'s own sweep of its name would miss them."""
    return remove_stale(folder, file_temp_pattern()) + remove_dead_pid_temps(folder)


def write_file(path: str, write, sweep: bool = False) -> None:
    """Write a file atomically: `write(f)` fills a locked temporary beside `path`, which
    is fsynced and renamed over it. Temporaries of killed writers of `path` are removed
    first; with `sweep`, those of every file in the folder (`sweep_temps`)."""
    folder, base = os.path.split(os.path.abspath(path))
    if sweep:
        sweep_temps(folder)
    else:
        remove_stale(folder, file_temp_pattern(base))
    fd, tmp = create_file(folder, lambda tok: _temp_name(base, tok))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            # renamed while its lock is held: no cleaner can take it for a dead save's
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(folder)   # make the rename itself durable
