"""Shared pieces of the benchmarks: statistics, workspaces, manifests, processes, cleanup.

Every benchmark runs the real ``reconcile`` CLI in subprocesses on a node of its own
(``--node bench-<pid>-<n>``), so cleanup can find and kill exactly the engines it started
by their ``RECONCILE_INSTANCE`` marker, and nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.host import cgroups
from controller.store.config import stateid

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENGINE = HERE / "engine.py"
PYTHON = sys.executable
MARKER = "RECONCILE_INSTANCE"


# -- statistics ---------------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def p95(xs: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    s = sorted(xs)
    if not s:
        return float("nan")
    rank = max(1, -(-95 * len(s) // 100))
    return s[rank - 1]


@dataclass
class Row:
    """One line of the table: our figure, the alternative's, and the goal."""

    section: str
    metric: str
    unit: str
    ours: list[float]
    theirs: list[float] = field(default_factory=list)
    alt: str = ""  # what `theirs` is
    goal: str = ""
    met: bool | None = None  # None: no goal on this line
    ratio: float | None = None  # ours / theirs unless set
    note: str = ""

    def __post_init__(self) -> None:
        if self.ratio is None and self.ours and self.theirs:
            self.ratio = median(self.ours) / median(self.theirs)

    def as_json(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "metric": self.metric,
            "unit": self.unit,
            "ours": self.ours,
            "theirs": self.theirs,
            "alt": self.alt,
            "ours_median": median(self.ours),
            "ours_p95": p95(self.ours),
            "theirs_median": median(self.theirs) if self.theirs else None,
            "theirs_p95": p95(self.theirs) if self.theirs else None,
            "ratio": self.ratio,
            "goal": self.goal,
            "met": self.met,
            "note": self.note,
        }


# -- workspaces ---------------------------------------------------------------------------

_counter = 0
KEEP = ("daemon.log", "exec.log", "supervisord.log", "cli.log")
raw_dir: Path | None = None  # where workspaces leave their logs (set by __main__)


def keep_logs(root: Path, tag: str) -> None:
    """Copy a workspace's logs into the raw output folder before it is removed."""
    if raw_dir is None:
        return
    target = raw_dir / tag
    for name in KEEP:
        if (root / name).exists():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / name, target / name)


@dataclass
class Workspace:
    """A tmp dir with a manifests folder, a state dir, an exec log and a node of its own."""

    root: Path
    node: str
    devices: str = "nvidia:0,nvidia:1"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def exec_log(self) -> Path:
        return self.root / "exec.log"

    def common(self) -> list[str]:
        return [
            "-f",
            str(self.manifests),
            "--state-dir",
            str(self.state),
            "--node",
            self.node,
            "--devices",
            self.devices,
        ]

    def env(self) -> dict[str, str]:
        # Bytecode allowed: an installed package has its .pyc files; measuring with
        # PYTHONDONTWRITEBYTECODE=1 (as a dev shell may set) recompiles every module
        # on every run and inflated the start-up figures.
        skip = ("RECONCILE_", "PYTHONDONTWRITEBYTECODE")
        env = this_tree({k: v for k, v in os.environ.items() if not k.startswith(skip)})
        env["BENCH_EXEC_LOG"] = str(self.exec_log)
        return env


def this_tree(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout first on the import path: the daemon's children (the
    gateway process, started with ``cwd=/``) import the code being measured, not whatever
    checkout is installed (a second checkout measured the installed gateway)."""
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{REPO}{os.pathsep}{rest}" if rest else str(REPO)}


@contextlib.contextmanager
def workspace(tag: str) -> Iterator[Workspace]:
    """A workspace whose engines are all killed (by marker) and whose files are removed."""
    global _counter
    _counter += 1
    root = Path(tempfile.mkdtemp(prefix=f"reconcile-bench-{tag}-"))
    ws = Workspace(root=root, node=f"bench-{os.getpid()}-{_counter}")
    ws.manifests.mkdir()
    try:
        yield ws
    finally:
        kill_marked(f"{ws.node}/")
        known = stateid.peek(ws.state) if ws.state.is_dir() else None
        if known is not None:  # its engines were killed by marker: no teardown cleared them
            cgroups.clear(known, 20.0)
        keep_logs(root, f"{tag}-{_counter}")
        shutil.rmtree(root, ignore_errors=True)


def reconcile_argv() -> list[str]:
    """The console script users run (falls back to ``python -m controller``)."""
    script = Path(PYTHON).with_name("reconcile")
    return [str(script)] if script.exists() else [PYTHON, "-m", "controller"]


def engine_argv(port: str = "{port}") -> list[str]:
    return [PYTHON, "-S", "-I", str(ENGINE), port]


# -- manifests ------------------------------------------------------------------------------


def manifest(
    name: str,
    command: Sequence[str],
    *,
    base_port: int,
    readiness: Mapping[str, Any] | None = None,
) -> str:
    """One Deployment document as YAML (JSON is YAML: no yaml import needed here)."""
    spec: dict[str, Any] = {
        "engine": "command",
        "command": list(command),
        "basePort": base_port,
        "stopGracePeriodSeconds": 2,
    }
    if readiness is not None:
        spec["readiness"] = dict(readiness)
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": spec,
    }
    return json.dumps(doc, indent=1) + "\n"


HTTP_READY = {"httpGet": {"path": "/health"}, "deadlineSeconds": 60, "periodSeconds": 0.1}


def write_file(path: Path, text: str) -> float:
    """Write and close ``path``; returns the wall-clock time right after the close."""
    with open(path, "w") as f:
        f.write(text)
    return time.time()


# -- processes --------------------------------------------------------------------------------


def run(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 300
) -> float:
    """Run a command to completion (output discarded); returns its wall time in seconds."""
    start = time.perf_counter()
    proc = subprocess.run(
        list(argv),
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
        check=False,
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{err}")
    return took


def marked_pids(prefix: str) -> set[int]:
    needle = f"{MARKER}={prefix}".encode()
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if any(item.startswith(needle) for item in data.split(b"\0")):
            found.add(int(entry.name))
    return found


def kill_marked(prefix: str, timeout: float = 20.0) -> int:
    """SIGKILL every process carrying the marker ``prefix`` until none is left."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {p for p in marked_pids(prefix) if not _zombie(p)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.02)
    return len(killed)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# Ports are claimed as the suite's tests claim theirs (tests/procs.py `free_ports`): in
# aligned blocks of BLOCK from LOCKED_FROM, each held by a flock on a file every process
# of this user sees, until this process ends. Found free alone was not enough: a smoke
# run beside the suite (tests/test_benchmarks_smoke.py) could take a block a test held
# but had not bound yet, and two sections at once the same block.
LOCKED_FROM = 20000
BLOCK = 16
PORT_LOCKS = Path(tempfile.gettempdir()) / f"reconcile-test-ports-{os.getuid()}"
_claimed: list[int] = []  # the lock fds of the blocks this process took: kept open


def free_port_block(count: int, start: int = 20000, stop_at: int = 32768) -> int:
    """The first port of ``count`` consecutive ports nobody binds and no other process
    claims, scanning upward from ``start``'s block; its blocks stay claimed for good.

    Below Linux's ephemeral range (32768+), so no outgoing connection takes one meanwhile.
    """
    PORT_LOCKS.mkdir(mode=0o700, exist_ok=True)
    blocks = -(-count // BLOCK)
    first = max(0, -(-(start - LOCKED_FROM) // BLOCK))
    while LOCKED_FROM + (first + blocks) * BLOCK <= stop_at:
        base = LOCKED_FROM + first * BLOCK
        locks = claim_blocks(range(first, first + blocks))
        if locks is not None:
            if all(_bindable(p) for p in range(base, base + count)):
                _claimed.extend(locks)
                return base
            for fd in locks:
                os.close(fd)
        first += 1
    raise RuntimeError(f"no block of {count} free ports between {start} and {stop_at}")


def release_claims() -> None:
    """Give back every block this process claimed: for a process that outlives the
    benchmark it ran in process (a test's)."""
    while _claimed:
        os.close(_claimed.pop())


def claim_blocks(blocks: range, folder: Path = PORT_LOCKS) -> list[int] | None:
    """The locks of ``blocks`` (numbered from LOCKED_FROM), all taken, or None (and none
    kept) when one is held: the one claim on ports the benchmarks and the tests share
    (``folder``: the locks' own, PORT_LOCKS but where a test keeps its own apart)."""
    locks: list[int] = []
    for block in blocks:
        fd = os.open(folder / f"{block}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        locks.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            for taken in locks:
                os.close(taken)
            return None
    return locks


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/1.0 200")
    except OSError:
        return False


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.002) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g}s")
        time.sleep(poll)


# -- the stand-in engine's exec log ----------------------------------------------------------


@dataclass(frozen=True)
class Exec:
    pid: int
    t: float
    name: str


def read_execs(path: Path) -> list[Exec]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append(Exec(int(parts[0]), float(parts[1]), parts[2]))
    return out


def engine_startup_ms(trials: int = 10) -> list[float]:
    """Popen -> the stand-in engine's first statement: the offset every exec time carries."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "exec.log"
        port = free_port_block(1, 26000)
        env = {**os.environ, "BENCH_EXEC_LOG": str(log), "BENCH_NAME": "probe"}
        for i in range(trials):
            t = time.time()
            proc = subprocess.Popen(engine_argv(str(port)), env=env)
            wait_for(lambda i=i: len(read_execs(log)) > i, 10, "the engine's first line")
            out.append((read_execs(log)[i].t - t) * 1000)
            stop(proc, signal.SIGKILL)
    return out
