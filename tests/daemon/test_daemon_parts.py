"""The daemon's parts and its service files: sd_notify on a real datagram socket, the
systemd unit through ``systemd-analyze verify``, the cron line run as written, the
timer heap, the folder-event filter, and engine-exit watching with and without pidfds.
"""

from __future__ import annotations

import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import missing
import pytest
from procs import wait_for
from watchdog.events import (
    DirCreatedEvent,
    DirModifiedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
)

from controller.backends.local.runtime import LocalBackend
from controller.cli.gateway.startlock import stopped
from controller.core.state import ProcessRef
from controller.daemon.engine_exits import ExitWatch
from controller.daemon.folders import ManifestWatch
from controller.daemon.notify import Notifier
from controller.daemon.timers import (
    WRITE_HOLD_MAX,
    WRITE_QUIET,
    Settling,
    Timers,
    debounce_until,
)
from controller.failpoints import ENV as FAILPOINTS
from controller.host.procs import identity
from controller.store.lock import FileLock
from controller.store.watch import _Handler

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "examples" / "systemd" / "reconcile.service"
CRON = REPO / "examples" / "cron" / "reconcile.cron"
RAY_ENV = REPO / "examples" / "ray" / "reconcile.env"


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(30)
    yield sock, path
    sock.close()


# -- sd_notify ---------------------------------------------------------------------------


def test_notify_sends_one_datagram_and_takes_the_variables_out(
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier.from_environ(env)
    assert env == {}, "engines must not inherit the service's notify socket"
    assert notifier.ping_interval == 2.0
    assert notifier.send("READY=1", "STATUS=ok")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ok"


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"reconcile-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(30)
        assert Notifier(f"@{name}").send("WATCHDOG=1")
        assert sock.recv(64) == b"WATCHDOG=1"


def test_notify_outside_systemd_is_a_no_op() -> None:
    assert not Notifier.from_environ({}).send("READY=1")
    other = {"NOTIFY_SOCKET": "/nonexistent/socket", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environ(other)
    assert notifier.ping_interval is None  # pid 1's watchdog, not ours
    assert not notifier.send("READY=1")  # nobody listens: no exception either


def test_the_daemon_says_ready_after_its_first_pass_then_pings(
    reconcile: Any, daemon: Any, finish: Any, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    reconcile.write("svc", command=["sleep", "600"], readiness={"periodSeconds": 0.2})
    # WATCHDOG_PID is left out: systemd sets it, but this daemon's pid is not known yet.
    d = daemon(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "300000"})
    first = sock.recv(4096).decode()
    assert first.startswith("READY=1\nSTATUS=pass 1: 1/1 ready"), first
    assert d.passes(), "READY=1 comes after the first pass"
    messages = {sock.recv(4096) for _ in range(3)}
    assert b"WATCHDOG=1" in messages, messages
    engine = reconcile.record("svc")["ref"]["pid"]
    assert "NOTIFY_SOCKET" not in reconcile.environ(engine)
    finish(d)
    assert b"STOPPING=1" in _drain(sock)


def test_a_first_pass_that_cannot_go_through_still_ends_the_start(
    reconcile: Any, daemon: Any, finish: Any, notify_socket: tuple[socket.socket, str]
) -> None:
    """systemd waits for READY=1 (TimeoutStartSec, 90 s), then kills the service and starts
    it again, the start failed: a daemon whose first pass cannot go through (here another
    process holds the pass lock; a state dir unmounted or full, the cluster away) is up all
    the same and tries again by itself, so it says READY=1, and STATUS= says why."""
    sock, path = notify_socket
    reconcile.write("svc", command=["sleep", "600"])
    reconcile.store()
    other_pass = FileLock(reconcile.state / "pass.lock", what="pass lock")
    other_pass.acquire(timeout=0)
    try:
        d = daemon(env={"NOTIFY_SOCKET": path})
        first = sock.recv(4096).decode()  # the fixture's 30 s: before, none came at all
        assert first.startswith("READY=1\nSTATUS=pass waits: the pass lock"), first
        assert not d.passes() and reconcile.pids("svc") == set()
    finally:
        other_pass.release()
    # The lock free, the next try goes through: STATUS= says so, with no READY=1 again.
    went = sock.recv(4096).decode()
    assert went.startswith("STATUS=pass 1: "), went
    finish(d)


def test_a_status_too_long_for_systemd_is_cut_not_dropped(
    reconcile: Any, notify_socket: tuple[socket.socket, str], tmp_path: Path
) -> None:
    """systemd drops a notify datagram over 4096 bytes whole, READY=1 in it, and the start
    times out: the pass lock's message names its path, so a state dir path of 3,950
    characters (PATH_MAX is 4,096; no message of a pass is that long otherwise) made the
    datagram over 4,100 bytes. The status is cut to fit, on one line."""
    sock, path = notify_socket
    reconcile.write("svc", command=["sleep", "600"])  # a pass with nothing to do takes no lock
    state = tmp_path
    while len(str(state)) < 3950:
        state /= "d" * min(200, max(1, 3950 - len(str(state)) - 1))
    state.mkdir(parents=True, mode=0o700)
    node = ["--node", reconcile.node, "--devices", reconcile.devices]
    argv = reconcile.argv(
        "-f", str(reconcile.manifests), "--state-dir", str(state), *node, common=False
    )
    other_pass = FileLock(state / "pass.lock", what="pass lock")
    other_pass.acquire(timeout=0)
    try:
        d = reconcile.spawn(argv, env={**reconcile.env, "NOTIFY_SOCKET": path})
        first = sock.recv(65536)
        d.send_signal(signal.SIGTERM)  # before the lock is free: it starts nothing
        assert d.wait(timeout=30) == 0
    finally:
        other_pass.release()
    assert len(first) <= 4096 and first.startswith(b"READY=1\nSTATUS=pass waits: "), first
    assert first.count(b"\n") == 1 and first.endswith("…".encode()), first


def test_a_pass_the_stop_came_before_says_it_was_given_up(
    reconcile: Any, daemon: Any, notify_socket: tuple[socket.socket, str]
) -> None:
    """A SIGTERM as the first pass began (its lock taken, nothing read: the pass ends
    before its first round) logged `pass` n=1 with no action and told systemd READY=1
    `pass 1: 0/0 ready`, of a folder whose manifest it never read."""
    sock, path = notify_socket
    reconcile.write("svc", command=["sleep", "600"])
    d = daemon(env={"NOTIFY_SOCKET": path, FAILPOINTS: "reconciler.pass.locked=stop"})
    try:
        reconcile.wait_for(lambda: stopped(d.pid), what="the daemon stopped in its pass")
        os.kill(d.pid, signal.SIGTERM)  # taken once it runs again
    finally:
        os.kill(d.pid, signal.SIGCONT)
    assert d.ended("SIGTERM") == 0
    assert _drain(sock) == {b"STOPPING=1"}
    assert not d.passes() and d.lines("pass given up: the daemon stops"), d.tail()
    assert reconcile.pids("svc") == set()


def test_a_refused_reload_is_in_the_status_until_one_goes_through(
    reconcile: Any, daemon: Any, finish: Any, notify_socket: tuple[socket.socket, str]
) -> None:
    """systemd takes the READY=1 after RELOADING=1 for a reload done (`systemctl reload`
    exits 0): one the daemon refused (a broken node.yaml, the configuration before it
    kept) said so in its log alone, while `systemctl status` read `pass N: 1/1 ready`."""
    sock, path = notify_socket
    reconcile.write("svc", command=["sleep", "600"])
    d = daemon(env={"NOTIFY_SOCKET": path})
    assert _until_ready(sock).startswith("READY=1\nSTATUS=pass 1: ")
    node_file = reconcile.state / "node.yaml"
    node_file.write_text("labels: {gpu: [h100\n")
    d.proc.send_signal(signal.SIGHUP)
    refused = _until_ready(sock)
    assert "; reload refused, the configuration before it kept: " in refused, refused
    assert f"{node_file}:" in refused and "invalid YAML" in refused, refused
    node_file.write_text("labels: {gpu: h100}\n")
    d.proc.send_signal(signal.SIGHUP)
    taken = _until_ready(sock)
    assert taken.startswith("READY=1\nSTATUS=pass ") and "refused" not in taken, taken
    finish(d)


def _until_ready(sock: socket.socket) -> str:
    """The messages up to the next READY=1 (a start's, or a reload's end): that one."""
    while not (said := sock.recv(4096).decode()).startswith("READY=1"):
        pass
    return said


def _drain(sock: socket.socket) -> set[bytes]:
    sock.settimeout(0)
    out = set()
    while True:
        try:
            out.add(sock.recv(4096))
        except BlockingIOError:
            return out


# -- the service files ---------------------------------------------------------------------


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason=missing.reason("systemd-analyze", "apt-get install systemd"),
)
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at this checkout's script.
    script = str(Path(sys.executable).parent / "reconcile")
    assert os.access(script, os.X_OK), script
    text = UNIT.read_text().replace("/usr/local/bin/reconcile", script)
    unit = tmp_path / "reconcile.service"
    unit.write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    about_it = [line for line in proc.stderr.splitlines() if "reconcile.service" in line]
    assert proc.returncode == 0 and not about_it, proc.stderr
    assert "Type=notify" in text and "KillMode=process" in text  # engines outlive the daemon


def test_a_usage_error_in_execstart_is_not_restarted(reconcile: Any) -> None:
    """`Restart=on-failure` restarts on any exit but 0: a misspelt flag in ExecStart (exit
    64, usage) was started again every RestartSec, each start the same error, for good
    (RestartSec=2 keeps it under the start limit's 5 in 10 s). No restart mends it, so the
    unit names that code in RestartPreventExitStatus, and the daemon exits with it."""
    lines = UNIT.read_text().splitlines()
    prevent = [
        ln.split("=", 1)[1].split() for ln in lines if ln.startswith("RestartPreventExitStatus=")
    ]
    exec_start = next(ln.split("=", 1)[1] for ln in lines if ln.startswith("ExecStart="))
    argv = [*shlex.split(exec_start)[1:], "--resnyc", "5"]  # an operator's slip: --resync
    argv[argv.index("/var/lib/reconcile")] = str(reconcile.state)
    result = reconcile(*argv, common=False)
    assert result.code == 64 and "--resync" in result.err, str(result)
    assert [str(result.code)] in prevent, prevent
    assert not reconcile.state.exists(), "a usage error touches nothing"


def test_the_cron_line_runs_as_written(reconcile: Any) -> None:
    lines = [ln for ln in CRON.read_text().splitlines() if ln[:1] == "*" or ln[:1].isdigit()]
    assert len(lines) == 1, lines
    argv = shlex.split(lines[0])[6:]  # after five time fields and the user
    assert argv[0] == "reconcile" and "--once" in argv
    paths = {
        "/etc/reconcile/manifests": str(reconcile.manifests),
        "/var/lib/reconcile": str(reconcile.state),
    }
    argv = [paths.get(a, a) for a in argv[1:]]
    reconcile.write("cronned", command=["sleep", "600"], readiness={"periodSeconds": 0.2})
    extra = ["--node", reconcile.node, "--devices", reconcile.devices]
    result = reconcile(*argv, *extra, common=False)
    assert result.code == 0, str(result)
    assert reconcile.record("cronned")["phase"] == "Ready"
    reconcile.down()


def test_the_ray_env_file_reads_the_same_to_systemd_and_to_a_shell() -> None:
    """It says it is a systemd EnvironmentFile or sourced by a cron line. systemd takes
    only a whole line for a comment: `KEY=value   # why` gave KEY the comment too, a state
    dir named `/var/lib/reconcile-ray  # records stay here...` (a README trial)."""
    as_systemd = {}
    for line in RAY_ENV.read_text().splitlines():
        if line.strip() and line.lstrip()[0] not in "#;":
            key, _, value = line.partition("=")
            as_systemd[key.strip()] = value.strip()  # systemd's rule for an unquoted value
    script = f'set -a; . "{RAY_ENV}"; env -0'
    shell = subprocess.run(["sh", "-c", script], capture_output=True, timeout=30, env={})
    assert shell.returncode == 0, shell.stderr
    as_shell = dict(item.split("=", 1) for item in shell.stdout.decode().split("\0") if item)
    assert as_systemd and {k: as_shell.get(k) for k in as_systemd} == as_systemd


# -- timers ----------------------------------------------------------------------------------


def test_timers_fire_in_order_and_rearming_replaces() -> None:
    t = Timers()
    t.set("resync", 10.0)
    t.set("probe", 3.0, "probe due")
    t.set("probe", 5.0, "probe due")  # re-armed: the 3.0 arming is void
    t.set("gone", 1.0)
    t.cancel("gone")
    assert t.timeout(0.0) == 5.0
    assert t.pop_due(4.0) == []
    assert t.pop_due(6.0) == [("probe", "probe due")]
    t.set("record:a", 7.0)
    t.set("record:b", 8.0)
    t.cancel_prefix("record:")
    assert t.timeout(6.0) == 4.0 and not t.armed("record:a")
    assert t.pop_due(11.0) == [("resync", "resync")]
    assert t.timeout(11.0) is None


@pytest.mark.parametrize(
    ("now", "delay", "pending", "expect"),
    [
        pytest.param(0.0, 0.1, None, 0.1, id="first-event"),
        pytest.param(0.05, 0.1, 0.1, 0.15, id="another-event-pushes-it-later"),
        pytest.param(0.05, 0.01, 0.1, 0.1, id="a-closed-file-never-pulls-in-a-deletions-wait"),
        pytest.param(0.0, 0.01, None, 0.01, id="a-closed-file-alone-passes-early"),
        pytest.param(0.95, 0.1, 1.0, 1.0, id="capped-since-the-first-event"),
    ],
)
def test_debounces_only_move_later(
    now: float, delay: float, pending: float | None, expect: float
) -> None:
    assert debounce_until(now, delay, pending, since=0.0, cap=1.0) == pytest.approx(expect)


# -- the folder-event filter -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "relevant"),
    [
        pytest.param(FileModifiedEvent("/m/a.yaml"), True, id="write"),
        pytest.param(FileClosedEvent("/m/a.yml"), True, id="close-after-write"),
        pytest.param(FileOpenedEvent("/m/a.yaml"), False, id="our-own-read"),
        pytest.param(FileModifiedEvent("/m/.a.yaml.swp"), False, id="hidden-temp"),
        pytest.param(FileModifiedEvent("/m/a.yaml~"), False, id="backup"),
        pytest.param(FileModifiedEvent("/m/notes.txt"), False, id="not-a-manifest"),
        pytest.param(FileMovedEvent("/m/.a.yaml.tmp", "/m/a.yaml"), True, id="atomic-save"),
        pytest.param(FileMovedEvent("/m/a.yaml", "/m/a.yaml.bak"), True, id="moved-away"),
        pytest.param(FileModifiedEvent("/m/sub/a.yaml"), False, id="subfolder"),
        pytest.param(DirModifiedEvent("/m"), False, id="folder-touched"),
        pytest.param(DirCreatedEvent("/m"), True, id="folder-returns"),
        pytest.param(FileMovedEvent("/", "/m"), True, id="folder-renamed-in"),
    ],
)
def test_which_folder_events_wake_the_loop(event: Any, relevant: bool) -> None:
    watch = ManifestWatch([Path("/m")], lambda kind, path: None)
    assert bool(watch.changes(event)) is relevant


@pytest.mark.parametrize(
    ("event", "kinds"),
    [
        pytest.param(
            FileClosedEvent("/m/a.yaml"), [("settled", "/m/a.yaml")], id="closed-after-write"
        ),
        pytest.param(
            FileMovedEvent("/m/.a.tmp", "/m/a.yaml"),
            [("settled", "/m/a.yaml")],
            id="renamed-into-place",
        ),
        # git checkout and some editors delete a file just before writing it again: a
        # deletion (what stops engines) waits out the full debounce.
        pytest.param(FileDeletedEvent("/m/a.yaml"), [("deleted", "/m/a.yaml")], id="deleted-waits"),
        pytest.param(
            FileMovedEvent("/m/a.yaml", "/m/a.yaml.bak"),
            [("deleted", "/m/a.yaml")],
            id="moved-away",
        ),
        pytest.param(
            FileMovedEvent("/m/a.yaml", "/m/b.yaml"),
            [("deleted", "/m/a.yaml"), ("settled", "/m/b.yaml")],
            id="renamed",
        ),
        pytest.param(
            FileModifiedEvent("/m/a.yaml"), [("writing", "/m/a.yaml")], id="being-written"
        ),
        pytest.param(FileCreatedEvent("/m/a.yaml"), [("begun", "/m/a.yaml")], id="created"),
        # inotify's rename with one side in no watched folder: a move with no source (the
        # watch's full events; a creation otherwise, a file just begun) or no destination.
        pytest.param(
            FileMovedEvent("", "/m/a.yaml"), [("settled", "/m/a.yaml")], id="renamed-in-whole"
        ),
        pytest.param(
            FileMovedEvent("/m/a.yaml", ""), [("deleted", "/m/a.yaml")], id="renamed-out-gone"
        ),
        pytest.param(DirCreatedEvent("/m"), [("deleted", "/m")], id="folder-returns-waits"),
    ],
)
def test_what_each_event_says_of_its_file(event: Any, kinds: list[tuple[str, str]]) -> None:
    seen: list[tuple[str, str]] = []
    watch = ManifestWatch([Path("/m")], lambda kind, path: seen.append((kind, path)))
    _Handler(watch).on_any_event(event)
    assert seen == kinds


class _Counting(ManifestWatch):
    """A real watch that keeps every event the kernel woke its thread for."""

    def __init__(self, folders: list[Path]) -> None:
        super().__init__(folders, lambda kind, path: None)
        self.woken: list[str] = []

    def changes(self, event: FileSystemEvent) -> list[tuple[str, str]]:
        self.woken.append(os.fsdecode(event.src_path))
        return super().changes(event)


def test_reads_beside_the_folder_never_wake_the_watch(tmp_path: Path) -> None:
    """Reads in the folder or the folder above (the parent is watched for the folder's
    comings and goings) are asked of nobody: libfaketime re-reading a clock file there at
    every call overflowed the kernel's queue and starved the daemon."""
    folder = tmp_path / "m"
    folder.mkdir()
    beside, inside = tmp_path / "clock", folder / "a.yaml"
    beside.write_text("+0\n")
    inside.write_text("kind: Deployment\n")
    watch = _Counting([folder])
    watch.start()
    try:
        for _ in range(200):
            beside.read_text()
            inside.read_text()
        (folder / "b.yaml").write_text("kind: Deployment\n")  # the kernel queues in order
        wait_for(lambda: str(folder / "b.yaml") in watch.woken, what="b.yaml's events")
    finally:
        watch.stop()
    assert set(watch.woken) == {str(folder / "b.yaml")}, watch.woken[:5]


@pytest.mark.parametrize(
    ("events", "whole"),
    [
        pytest.param([("writing", "a"), ("settled", "a")], True, id="written-then-closed"),
        pytest.param([("settled", "a")], True, id="renamed-into-place"),
        pytest.param([("writing", "a")], False, id="still-being-written"),
        pytest.param([("begun", "a")], False, id="created-not-yet-closed"),
        pytest.param([("begun", "a"), ("writing", "a"), ("settled", "a")], True, id="new-file"),
        pytest.param(
            [("writing", "a"), ("writing", "b"), ("settled", "a")], False, id="b-still-open"
        ),
        pytest.param([("deleted", "a"), ("writing", "a"), ("settled", "a")], False, id="checkout"),
        pytest.param([("settled", "b"), ("deleted", "a")], False, id="a-deletion-waits"),
    ],
)
def test_a_pass_runs_early_only_once_every_change_is_whole(
    events: list[tuple[str, str]], whole: bool
) -> None:
    settling = Settling()
    for kind, path in events:
        settling.note(kind, path)
    assert settling.whole is whole


@pytest.mark.parametrize(
    ("events", "now", "held"),
    [
        pytest.param([("writing", "a", 0.0)], 1.0, ("a", WRITE_QUIET), id="open-after-a-pause"),
        pytest.param([("writing", "a", 0.0), ("settled", "a", 1.0)], 1.0, None, id="closed"),
        pytest.param([("writing", "a", 0.0)], WRITE_QUIET, None, id="no-close-seen-quiet-ends-it"),
        pytest.param(
            [("writing", "a", 0.0), ("writing", "a", 2.0)],
            4.0,
            ("a", 2.0 + WRITE_QUIET),
            id="a-later-write-moves-it",
        ),
        pytest.param(
            [("writing", "a", 0.0), ("writing", "a", WRITE_HOLD_MAX - 1)],
            WRITE_HOLD_MAX,
            None,
            id="written-on-and-on-its-cap-ends-it",
        ),
        pytest.param(
            [("writing", "a", 0.0), ("writing", "b", 1.0), ("settled", "b", 1.5)],
            2.0,
            ("a", WRITE_QUIET),
            id="the-one-still-open",
        ),
        pytest.param([("writing", "a", 0.0), ("deleted", "a", 0.5)], 1.0, None, id="gone"),
        pytest.param([("deleted", "a", 0.0)], 0.0, None, id="a-deletion-holds-nothing"),
        pytest.param([("begun", "a", 0.0)], 0.0, None, id="created-nothing-written-yet"),
    ],
)
def test_a_file_written_and_not_closed_holds_the_passes(
    events: list[tuple[str, str, float]], now: float, held: tuple[str, float] | None
) -> None:
    """What a pass waits for: a file seen written and not yet closed, until its close or
    its writer's bounds (a truncate by path, a lost close)."""
    settling = Settling()
    for kind, path, at in events:
        settling.note(kind, path, at)
    assert settling.held(now) == held


# -- engine exits -----------------------------------------------------------------------------


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "liveness-fallback"])
def test_an_engine_exit_is_reported_once(tmp_path: Path, pidfds: bool) -> None:
    runtime = LocalBackend(tmp_path, f"t-{uuid.uuid4().hex[:8]}")
    child = subprocess.Popen(["sleep", "600"])
    try:
        ref = identity(child.pid)
        assert ref is not None
        seen: list[tuple[str, ProcessRef]] = []
        with selectors.DefaultSelector() as selector:
            watch = ExitWatch(selector, runtime, lambda name, r: seen.append((name, r)))
            watch.pidfds = pidfds
            watch.sync({"e": ref})
            assert watch.polling is not pidfds and seen == []
            child.kill()
            child.wait(timeout=30)
            if pidfds:
                for key, _ in selector.select(timeout=30):
                    key.data()
            else:
                watch.check()
            watch.sync({"e": ref})  # the record still names it: no second report
            watch.close()
        assert seen == [("e", ref)]
    finally:
        child.kill()
        child.wait(timeout=30)
