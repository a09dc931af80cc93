"""Process and port helpers for tests that run real engines (importable as ``procs``).

``tests/`` is on ``sys.path`` under pytest (its conftest puts it there), so any test,
in any subfolder, can ``from procs import marked_pids, wait_for``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import BLOCK, LOCKED_FROM, PORT_LOCKS, claim_blocks

MARKER = "RECONCILE_INSTANCE"
GATEWAY_MARKER = "RECONCILE_GATEWAY"  # a gateway process: <node>/<nonce>
# An engine (argv[1]: its port) that ignores SIGTERM: only the SIGKILL after the grace
# period ends it, so its teardown lasts that whole period.
IGNORE_TERM = """
import http.server, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat (None when the pid is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def alive(pid: int) -> bool:
    """A live process (a zombie is not one)."""
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def environ(pid: int) -> dict[str, str]:
    """A live process's environment, from /proc/<pid>/environ."""
    data = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def execed(pid: int, timeout: float = 10.0) -> int:
    """``pid`` once its exec is complete. ``Popen`` returns as the exec closes its pipe,
    an instant before the kernel fills ``/proc/<pid>/environ`` (empty until then)."""
    wait_for(lambda: environ(pid), timeout=timeout, what=f"pid {pid}'s exec")
    return pid


def marked_pids(prefix: str, marker: str = MARKER) -> set[int]:
    """Live processes whose ``marker`` (RECONCILE_INSTANCE) starts with ``prefix``."""
    needle = f"{marker}={prefix}".encode()
    # A variable that starts with the needle: the first, or one after a NUL. Splitting
    # each environment into its variables was ~60% of a scan's CPU, and teardown and the
    # tests' waits scan every process on the box, thousands of times a run.
    inner = b"\0" + needle
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if (data.startswith(needle) or inner in data) and alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def kill_marked(prefix: str, timeout: float = 10.0, marker: str = MARKER) -> dict[int, str]:
    """SIGKILL every process marked ``prefix`` until none is left; returns what was found.
    The engine cgroups they were in go too (what is left in them, then the folder)."""
    from controller.host import cgroups

    found: dict[int, str] = {}
    engine_cgroups: set[Path] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = marked_pids(prefix, marker)
        if not pids:
            break
        for pid in pids:
            found.setdefault(pid, cmdline(pid))
            cg = cgroups.of_pid(pid)
            if cg is not None and cg.name.startswith(cgroups.PREFIX):
                engine_cgroups.add(cg)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    for cg in engine_cgroups:
        cgroups.kill(cg, time.monotonic() + timeout)
        cgroups.remove(cg)
    return found


def kill_cgroups(state: Path, timeout: float = 30.0) -> None:
    """Kill every process in the engine cgroups of the state dir at ``state`` (one that
    left its engine's session and dropped the marker, which ``kill_marked`` misses) and
    remove them: a test killed before its `down` leaves none behind."""
    from controller.host import cgroups
    from controller.store.config import stateid

    known = stateid.peek(state) if state.is_dir() else None
    if known is not None:
        cgroups.clear(known, timeout)


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} ({cmdline(pid)}) still alive after {timeout}s")
        time.sleep(0.02)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (no timed assert: a generous cap)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout}s")
        time.sleep(0.05)


def unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m controller ARGS`` as a user who is not root: in a new user namespace
    (``unshare -U``) when the tests run as root, where binding a port below the unprivileged
    range is refused and a file's mode bits bind (its owner, uid 0 outside, is unmapped)."""
    import controller

    wrap = ["unshare", "-U"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(Path(controller.__file__).parents[1])}
    argv = [*wrap, sys.executable, "-m", "controller", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def wait_past(moment: datetime, what: str = "the moment") -> None:
    """Wait until the wall clock is past ``moment`` (a back-off's end a record or pull
    names): a test loops its passes after that, not through the whole wait, each a CLI
    start (~0.3 s of CPU, more on Ray or with a container runtime) that moves nothing."""
    left = (moment - datetime.now(UTC)).total_seconds()
    wait_for(lambda: datetime.now(UTC) >= moment, timeout=max(left, 0) + 15, what=what)


# -- ports ---------------------------------------------------------------------------------


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def accepts(port: int) -> bool:
    """Something listens on ``port`` (a connection is accepted). Not ``not bindable``: an
    http.server engine binds, then looks its host's name up (getfqdn), then listens; a
    request sent in between is refused."""
    with socket.socket() as s:
        s.settimeout(5.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


PORTS = (LOCKED_FROM, 32000)  # where tests' ports are: below the ephemeral range (32768-60999)
# A block's lock (benchmarks/common.py `claim_blocks`, which the benchmarks claim theirs by
# too): a file flocked by the process that holds the block (released by release_ports, or
# when that process ends), aligned blocks of BLOCK ports. Every test process on the machine
# (each xdist worker, each run) sees the same files.
_held: dict[int, list[int]] = {}  # base port -> this process's lock fds for its blocks


def free_ports(count: int = 16) -> int:
    """The first port of ``count`` consecutive free ports outside the ephemeral range, in
    blocks no other test process holds: each is held (``release_ports``) as well as found
    free. Found free alone was not enough: two workers could take overlapping ranges at
    once, each found them free, and one test's gateway then found its port taken by the
    other's engine (a CI run's flake, tests/gateway/test_tokens.py)."""
    blocks = -(-count // BLOCK)
    rng = random.Random(uuid.uuid4().int)
    PORT_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for _ in range(200):
        first = rng.randrange((PORTS[1] - PORTS[0]) // BLOCK - blocks + 1)
        locks = claim_blocks(range(first, first + blocks), PORT_LOCKS)
        if locks is None:
            continue
        base = PORTS[0] + first * BLOCK
        if all(bindable(p) for p in range(base, base + count)):
            _held[base] = locks
            return base
        for fd in locks:
            os.close(fd)
    raise RuntimeError("no block of free ports found")


def held_ports() -> set[int]:
    """The base ports of the blocks this process holds now."""
    return set(_held)


def release_ports(bases: Iterable[int]) -> None:
    """Give back the blocks taken at ``bases`` (what used them has ended)."""
    for base in bases:
        for fd in _held.pop(base, ()):
            os.close(fd)


def listen(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return sock
