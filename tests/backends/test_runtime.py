"""Process handles on real processes: spawn, identity, markers, teardown, ports.

Every process here carries RECONCILE_INSTANCE=<unique node>/...; the fixture kills
whatever still does at teardown and waits for our own children.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from procs import alive, environ, kill_marked, marked_pids, wait_for, wait_gone

from controller.backends.choose import inventory_for, open_backend
from controller.backends.local.runtime import (
    MARKER,
    OWNER_MARKER,
    STATE_ID_MARKER,
    STATE_MARKER,
    LocalBackend,
)
from controller.core.state import ProcessRef
from controller.errors import ExecFailed
from controller.host import ports, sockdiag
from controller.host.ports import listening_ports, port_bindable
from controller.host.procs import identity
from controller.reconciler.run import Reconciler
from controller.store.config import stateid
from controller.store.config.node import Config

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)
# The engine forks a child in its group and a grandchild that leaves the group (setsid).
FAMILY = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    time.sleep(60); os._exit(0)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60); os._exit(0)
    os._exit(0)
print("up", flush=True)
time.sleep(60)
"""


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[LocalBackend]:
    runtime = LocalBackend(tmp_path, f"t-{uuid.uuid4().hex[:12]}")
    yield runtime
    kill_marked(f"{runtime.node}/")
    for child in list(runtime._children.values()):
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process that leads its own session and group (like any daemon)."""
    proc = subprocess.Popen(SLEEP, start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def spawn(rt: LocalBackend, argv: list[str], tmp: Path, name: str = "web") -> ProcessRef:
    return rt.spawn(argv, dict(os.environ), name=name, nonce="n1", log_path=tmp / f"{name}.log")


def family_of(rt: LocalBackend) -> set[int]:
    """The engine, its child and its grandchild, once all three are up: the grandchild in
    its own session, its maker gone. (Three marked processes may also be the engine, its
    child and the maker before its setsid: a group kill then takes the maker, and no
    grandchild is ever left for a sweep to find.)"""

    def ppid(pid: int) -> int:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])

    def three() -> set[int] | None:
        pids = marked_pids(f"{rt.node}/")
        if len(pids) != 3:
            return None
        try:
            sessions = {pid: os.getsid(pid) for pid in pids}
            apart = [p for p in pids if list(sessions.values()).count(sessions[p]) == 1]
            return pids if len(apart) == 1 and ppid(apart[0]) not in pids else None
        except (ProcessLookupError, FileNotFoundError):
            return None

    found: set[int] = wait_for(three, what="the engine's child and grandchild")
    return found


def test_identity_is_pid_and_start_time() -> None:
    me = identity(os.getpid())
    assert me is not None and me.pid == os.getpid() and me.start_time > 0
    assert identity(2**22 + 12345) is None


def test_spawn_in_a_new_session_with_markers(rt: LocalBackend, tmp_path: Path) -> None:
    ref = spawn(rt, SLEEP, tmp_path)
    assert rt.alive(ref)
    assert os.getpgid(ref.pid) == ref.pid and os.getsid(ref.pid) == ref.pid
    # /proc/<pid>/environ is empty for an instant after exec: wait for it.
    env = wait_for(lambda: environ(ref.pid).get(MARKER) and environ(ref.pid), what="environ")
    assert env[MARKER] == f"{rt.node}/web/n1"
    assert env[STATE_MARKER] == str(tmp_path.resolve())
    (found,) = rt.scan()
    assert (found.ref, found.name, found.nonce) == (ref, "web", "n1")


def test_an_engine_of_another_state_dir_at_this_path_is_a_stranger(
    rt: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine carries its state dir's id (never one reconcile itself inherited: one
    run from inside an engine); once another dir is at the path (another id, or none
    made yet), the scan leaves it out and ``strangers`` names it. One that carries no id
    (an older reconcile's) is this dir's, as before."""
    made = stateid.ensure(tmp_path)
    monkeypatch.setenv(STATE_ID_MARKER, "inherited")
    ref = spawn(rt, SLEEP, tmp_path)
    env = wait_for(lambda: environ(ref.pid).get(MARKER) and environ(ref.pid), what="environ")
    assert env[STATE_ID_MARKER] == made
    (ours,) = rt.scan()
    assert ours.ref == ref and ours.state_id == made and rt.strangers() == []
    (tmp_path / "id").unlink()  # the folder at the path has none yet: not the engine's
    assert rt.scan() == [] and [m.ref for m in rt.strangers()] == [ref]
    stateid.ensure(tmp_path)  # another id
    assert rt.scan() == [] and [m.ref for m in rt.strangers()] == [ref]
    (tmp_path / "id").unlink()
    older = spawn(rt, SLEEP, tmp_path, name="old")  # no id made: it carries none
    wait_for(lambda: environ(older.pid).get(MARKER), what="environ")
    assert STATE_ID_MARKER not in environ(older.pid)
    stateid.ensure(tmp_path)
    assert [m.ref for m in rt.scan()] == [older], "judged as before: this dir's"


@pytest.mark.parametrize("owner", ["/m/a,/m/b", None], ids=["a set's", "no set's"])
def test_the_marker_names_the_set_that_started_the_engine(
    tmp_path: Path, owner: str | None
) -> None:
    """A pass tells its own unrecorded engines from another set's by this fact; the spec's
    environment never forges it (a start on no set's behalf carries none)."""
    rt = LocalBackend(tmp_path, f"t-{uuid.uuid4().hex[:12]}", owner=owner)
    env = {**os.environ, OWNER_MARKER: "forged"}
    ref = rt.spawn(SLEEP, env, name="web", nonce="n1", log_path=tmp_path / "web.log")
    try:
        seen = wait_for(lambda: environ(ref.pid).get(MARKER) and environ(ref.pid), what="environ")
        assert seen.get(OWNER_MARKER) == owner
        (found,) = rt.scan()
        assert (found.ref, found.owner) == (ref, owner)
    finally:
        rt.kill(ref)  # and reaps it


def test_argv_never_goes_through_a_shell(rt: LocalBackend, tmp_path: Path) -> None:
    """Invariant 10: shell syntax in an argument stays a literal argument."""
    out = tmp_path / "argv"
    script = "import sys, json; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    tricky = ["$(touch pwned)", "; touch pwned2", "`touch pwned3`", "a b", "*"]
    ref = spawn(rt, [sys.executable, "-c", script, str(out), *tricky], tmp_path)
    wait_for(lambda: not alive(ref.pid) and out.exists(), what="the engine to write argv")
    assert out.read_text() == __import__("json").dumps(tricky)
    assert not any(tmp_path.glob("pwned*")) and not any(Path.cwd().glob("pwned*"))


def test_output_goes_to_the_log(rt: LocalBackend, tmp_path: Path) -> None:
    ref = spawn(
        rt,
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
        tmp_path,
    )
    wait_for(lambda: rt.exit_of(ref) is not None, what="the engine to exit")
    assert (tmp_path / "web.log").read_text().split() == ["out", "err"]


def test_missing_executable_is_a_spawn_error(rt: LocalBackend, tmp_path: Path) -> None:
    """An exec that failed is told apart by its type (not its words): ``ExecFailed``, with
    the gate's exit code, what --once and plan exit 1 on."""
    with pytest.raises(ExecFailed, match="cannot exec '/nonexistent/engine'") as failed:
        spawn(rt, ["/nonexistent/engine"], tmp_path)
    assert failed.value.code == 127


def test_exit_status_of_our_children(rt: LocalBackend, tmp_path: Path) -> None:
    ref = spawn(rt, [sys.executable, "-c", "raise SystemExit(3)"], tmp_path)
    wait_for(lambda: rt.exit_of(ref) is not None, what="the engine to exit")
    exit_ = rt.exit_of(ref)
    assert exit_ is not None and (exit_.code, exit_.signal) == (3, None)
    killed = spawn(rt, SLEEP, tmp_path, name="other")
    os.kill(killed.pid, signal.SIGKILL)
    wait_for(lambda: rt.exit_of(killed) is not None, what="the engine to die")
    assert rt.exit_of(killed) is not None and rt.exit_of(killed).signal == 9  # type: ignore[union-attr]
    assert not rt.alive(killed)


def test_invariant_6_a_reused_pid_is_not_alive(
    rt: LocalBackend, bystander: subprocess.Popen[bytes]
) -> None:
    real = identity(bystander.pid)
    assert real is not None and rt.alive(real)
    assert not rt.alive(ProcessRef(pid=bystander.pid, start_time=real.start_time - 5))
    assert not rt.alive(None)


def test_identity_survives_a_clock_step(
    rt: LocalBackend, bystander: subprocess.Popen[bytes]
) -> None:
    # NTP stepping the wall clock moves every start time computed from it (boot time
    # is "now - uptime"); the ticks after boot do not move. A step must not make a
    # live engine look dead (its deployment would be restarted for nothing).
    real = identity(bystander.pid)
    assert real is not None and real.start_ticks is not None and real.boot_id
    stepped = replace(real, start_time=real.start_time + 3600)
    assert rt.alive(stepped)
    other_process = replace(real, start_ticks=real.start_ticks - 100)
    assert not rt.alive(other_process)
    other_boot = replace(real, boot_id="another-boot")
    assert not rt.alive(other_boot)


def test_stop_never_signals_a_process_whose_identity_differs(
    rt: LocalBackend, bystander: subprocess.Popen[bytes]
) -> None:
    """Invariant 6: a record's pid now belongs to an unrelated group leader: it survives."""
    real = identity(bystander.pid)
    assert real is not None
    stale = ProcessRef(pid=bystander.pid, start_time=real.start_time - 100)
    rt.stop(stale, "n-gone", signal.SIGTERM, grace=0.2)
    rt.sweep("n-gone", stale)
    rt.kill(stale)
    time.sleep(0.1)
    assert bystander.poll() is None, "an unrelated process was killed"


def test_stop_never_signals_a_live_process_without_the_instance_marker(
    rt: LocalBackend, bystander: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """A record naming a live foreign process EXACTLY (pid and start time: edited by hand,
    forged) passes the identity check; only the missing marker keeps stop() off it."""
    exact = identity(bystander.pid)
    assert exact is not None and rt.alive(exact)
    assert MARKER not in environ(bystander.pid)
    rt.stop(exact, "n1", signal.SIGTERM, grace=0.2)
    rt.sweep("n1", exact)
    time.sleep(0.1)
    assert bystander.poll() is None, "stop() signalled a process that is not our engine"


def test_stop_never_signals_a_process_marked_for_another_instance(
    rt: LocalBackend, tmp_path: Path
) -> None:
    """Same node, same deployment name, another nonce: not this instance, not signalled."""
    other = subprocess.Popen(
        SLEEP,
        start_new_session=True,
        env={**os.environ, MARKER: f"{rt.node}/web/another-nonce"},
    )
    try:
        wait_for(lambda: MARKER in environ(other.pid), what="the marked process")
        exact = identity(other.pid)
        assert exact is not None
        rt.stop(exact, "n1", signal.SIGTERM, grace=0.2)
        time.sleep(0.1)
        assert other.poll() is None, "stop() signalled another instance's process"
    finally:
        other.kill()
        other.wait()


def test_stop_sigterm_then_grace_then_sigkill_the_whole_group(
    rt: LocalBackend, tmp_path: Path
) -> None:
    ref = spawn(rt, [sys.executable, "-c", FAMILY], tmp_path)
    wait_for(lambda: "up" in (tmp_path / "web.log").read_text(), what="the engine to start")
    family = family_of(rt)
    in_group = {p for p in family if os.getpgid(p) == ref.pid}
    assert in_group == {ref.pid, *in_group} and len(in_group) == 2  # one left the group
    started = time.monotonic()
    rt.stop(ref, "n1", signal.SIGTERM, grace=0.5)
    assert time.monotonic() - started >= 0.5  # SIGTERM was ignored: it waited out the grace
    for pid in family:
        assert not alive(pid), f"pid {pid} survived the teardown"
    assert rt.exit_of(ref) is not None and rt.exit_of(ref).signal == 9  # type: ignore[union-attr]


def test_stop_returns_as_soon_as_the_engine_exits(rt: LocalBackend, tmp_path: Path) -> None:
    ref = spawn(rt, SLEEP, tmp_path)
    rt.stop(ref, "n1", signal.SIGTERM, grace=30)
    wait_gone(ref.pid, timeout=1)
    assert rt.exit_of(ref) is not None and rt.exit_of(ref).signal == signal.SIGTERM  # type: ignore[union-attr]


def test_a_stopped_engine_is_continued_so_its_stop_signal_ends_it(
    rt: LocalBackend, tmp_path: Path
) -> None:
    ref = spawn(rt, SLEEP, tmp_path)
    os.kill(ref.pid, signal.SIGSTOP)  # hung: SIGTERM stays pending while it is stopped
    rt.stop(ref, "n1", signal.SIGTERM, grace=30)
    wait_gone(ref.pid, timeout=1)
    exit_ = rt.exit_of(ref)  # by SIGTERM, not by the SIGKILL at the end of the grace
    assert exit_ is not None and exit_.signal == signal.SIGTERM, exit_


def test_sweep_kills_marker_processes_of_a_dead_engine(rt: LocalBackend, tmp_path: Path) -> None:
    ref = spawn(rt, [sys.executable, "-c", FAMILY], tmp_path)
    family = family_of(rt)
    os.kill(ref.pid, signal.SIGKILL)
    assert rt.sweep("n1", ref) >= 1
    for pid in family:
        assert not alive(pid)


def test_scan_sees_only_its_node_and_state_dir(rt: LocalBackend, tmp_path: Path) -> None:
    other_state = LocalBackend(tmp_path / "elsewhere", rt.node)
    other_node = LocalBackend(tmp_path, rt.node + "x")
    try:
        spawn(rt, SLEEP, tmp_path, name="a")
        spawn(other_state, SLEEP, tmp_path, name="b")
        spawn(other_node, SLEEP, tmp_path, name="c")
        assert [m.name for m in rt.scan()] == ["a"]
    finally:
        for other in (other_state, other_node):
            kill_marked(f"{other.node}/")
            for child in other._children.values():
                child.wait()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_listening_ports_and_bind_probe(host: str) -> None:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        assert port not in listening_ports()  # bound, not listening: /proc/net misses it...
        assert not port_bindable(port)  # ...the bind probe does not
        sock.listen()
        assert port in listening_ports()
        assert not port_bindable(port)
    assert port_bindable(port)


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_netlink_and_proc_net_see_the_same_listeners(family: socket.AddressFamily) -> None:
    """sock_diag (the fast path) answers exactly what /proc/net lists in LISTEN."""
    try:
        sock = socket.socket(family)
    except OSError:
        pytest.skip("no IPv6 on this host")
    with sock:
        sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port in sockdiag.listening()
        # Other processes open and close listeners meanwhile: agreeing once is the test.
        pairs = [(sockdiag.listening(), ports._proc_net_listening()) for _ in range(5)]
        assert any(fast == slow for fast, slow in pairs), pairs[-1]
        # Each listener's address, uid and inode too (who holds a port: issue 34 item 1).
        ours = sockdiag.listeners(port)
        assert [(one.address, one.uid) for one in ours] == [(sock.getsockname()[0], os.getuid())]
        assert ours == [one for one in ports._proc_net_listeners() if one.port == port]
        assert ports.socket_holders(ours[0].inode) == [os.getpid()]


def test_placement_never_hands_out_a_port_a_socket_of_ours_holds(tmp_path: Path) -> None:
    """The bind probe in placement: a socket bound but not listening is invisible in
    /proc/net; a pass must still not hand its port to an engine (invariant 2)."""
    node = f"t-{uuid.uuid4().hex[:12]}"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert port not in listening_ports()  # only the bind probe can see it
        doc = {
            "apiVersion": "reconcile/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "engine": "command",
                "command": SLEEP,
                "basePort": port,
                "readiness": {"tcpSocket": {}, "deadlineSeconds": 30},
                "stopGracePeriodSeconds": 1,
            },
        }
        (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
        config = Config(
            manifests=(manifests,),
            state_dir=tmp_path / "state",
            node=node,
            devices="nvidia:0",
            owner="bind-probe-test",
        )
        reconciler = Reconciler(config, open_backend(config), inventory_for(config))
        try:
            result = reconciler.run_pass()
            web = result.records["web"]
            assert web.port is not None and web.port != port, web
            assert web.port > port  # basePort scans upward past the held one
        finally:
            reconciler.down()
            kill_marked(f"{node}/")
