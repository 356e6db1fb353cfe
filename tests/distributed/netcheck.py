"""What the issue 29 tests ask of processes and sockets: the TCP sockets a set of
processes listens on (from /proc), a process's descendants, and a shell command run in a
network namespace that has only loopback."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _stat(pid):
    """(ppid, session id, state) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[3]), fields[0]


def processes():
    """{pid: (ppid, sid, state)} of every process."""
    out = {}
    for n in os.listdir("/proc"):
        if n.isdigit():
            st = _stat(int(n))
            if st is not None:
                out[int(n)] = st
    return out


def descendants(pid, table=None):
    table = processes() if table is None else table
    kids: dict = {}
    for p, (pp, _, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid):
    st = _stat(pid)
    return st is not None and st[2] not in "ZX"   # a zombie has ended


def _socket_inodes(pid):
    out = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _address(hexaddr):
    ip, port = hexaddr.split(":")
    if len(ip) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(ip))), int(port, 16)
    words = [bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, 32, 8)]
    raw = b"".join(words)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:]), int(port, 16)
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2)), int(port, 16)


def listening(pids):
    """[(address, port, pid)] of the TCP sockets that `pids` listen on."""
    owner = {}
    for pid in pids:
        for ino in _socket_inodes(pid):
            owner.setdefault(ino, pid)
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[9]) in owner:   # 0A: LISTEN
                out.append((*_address(f[1]), owner[int(f[9])]))
    return out


def is_loopback(address):
    return (address.startswith("127.") or address.startswith("::ffff:127.")
            or address == "0000:0000:0000:0000:0000:0000:0000:0001")


def in_loopback_namespace(command, env=None, timeout=240):
    """Run the shell `command` in a new network namespace whose only interface is `lo`;
    skips the test where namespaces cannot be made (no unshare, not permitted)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1) to make a network namespace")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make a network namespace here: "
                    f"{probe.stderr.decode(errors='replace').strip()}")
    up = "ip link set lo up" if shutil.which("ip") else (
        "python3 -c \"import fcntl, socket, struct; s = socket.socket(); "
        "r = struct.pack('16sh', b'lo', 0); f = struct.unpack('16sh', fcntl.ioctl("
        "s, 0x8913, r))[1]; fcntl.ioctl(s, 0x8914, struct.pack('16sh', b'lo', f | 1))\"")
    return subprocess.run([unshare, "-n", "sh", "-c", f"{up} && {command}"], env=env,
                          capture_output=True, text=True, timeout=timeout)
