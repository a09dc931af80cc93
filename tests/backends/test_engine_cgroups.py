"""An engine's cgroup (controller/host/cgroups.py) at the backend: only a cgroup named for
this state dir and that run is ever killed, and where no cgroup is ours to write an
engine runs as before. The end-to-end case (`down` and an escaped child) is
tests/integration/test_engine_cgroup.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import alive, kill_cgroups, kill_marked, wait_for, wait_gone

from controller.backends.local.runtime import LocalBackend
from controller.core.state import ProcessRef, Record
from controller.host import cgroups
from controller.store.config import stateid
from controller.store.instances.spawnnotes import SpawnNote

WRITABLE = pytest.mark.skipif(
    cgroups.parent() is None,
    reason="no cgroup v2 folder this process may write (not root, cgroup v1 only, or "
    "systemd's own tree)",
)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[LocalBackend]:
    stateid.ensure(tmp_path)
    runtime = LocalBackend(tmp_path, f"t-{uuid.uuid4().hex[:12]}")
    yield runtime
    kill_marked(f"{runtime.node}/")
    for child in list(runtime._children.values()):
        child.kill()
        child.wait()
    kill_cgroups(tmp_path)  # an escaped child a failed test left in its engine's cgroup


# The engine double-forks a child that leaves its session and execs, through `env -i`, a
# Python with no environment (no marker) that takes its time over SIGTERM: it writes
# "term" to argv[2], then, once argv[3] exists, writes argv[3].ended and exits. The
# leader ("crash") exits 3 once the child has written its pid (argv[1]) with its
# handler set, or ("serve") waits for its own SIGTERM, which ends it at once.
CHILD = """
import os, signal, sys, time
pidfile, termfile, gofile = sys.argv[1:4]
def on_term(sig, frame):
    with open(termfile + ".tmp", "w") as f:
        f.write("term")
    os.rename(termfile + ".tmp", termfile)
    while not os.path.exists(gofile):
        time.sleep(0.01)
    open(gofile + ".ended", "w").close()
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
while True:
    signal.pause()
"""
LEADER = """
import os, signal, sys, time
child, pidfile, termfile, gofile, mode = sys.argv[1:6]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("env", ["env", "-i", sys.executable, "-c", child, pidfile, termfile, gofile])
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
if mode == "serve":
    while True:
        signal.pause()
sys.exit(3)
"""


class Escapee:
    """The files of an escaped child that ends on SIGTERM once ``go`` is called."""

    def __init__(self, at: Path) -> None:
        self.pidfile, self.termfile, self.gofile = at / "pid", at / "term", at / "go"

    def argv(self, mode: str = "crash") -> list[str]:
        files = (self.pidfile, self.termfile, self.gofile)
        return [sys.executable, "-c", LEADER, CHILD, *map(str, files), mode]

    def ended(self) -> bool:
        """It ended on its own, its SIGTERM handler through (no SIGKILL cut it short)."""
        return Path(f"{self.gofile}.ended").exists()

    def pid(self) -> int:
        return int(wait_for(self.pidfile.exists, timeout=60, what="the child") and
                   self.pidfile.read_text())  # fmt: skip

    def termed(self) -> bool:
        return self.termfile.exists() and self.termfile.read_text() == "term"

    def go(self) -> None:
        self.gofile.touch()


@pytest.fixture
def escapee(tmp_path: Path) -> Iterator[Escapee]:
    (tmp_path / "esc").mkdir()
    esc = Escapee(tmp_path / "esc")
    yield esc
    esc.go()  # one still waiting ends on its own: the fixture's cgroup kill does the rest


def escaped_engine(
    rt: LocalBackend, tmp_path: Path, esc: Escapee, nonce: str
) -> tuple[ProcessRef, int]:
    """The engine spawned, its child escaped, the leader dead: (leader, child's pid)."""
    ref = rt.spawn(esc.argv(), dict(os.environ), name="web", nonce=nonce,
                   log_path=tmp_path / "web.log")  # fmt: skip
    pid = esc.pid()
    wait_for(lambda: not rt.alive(ref), timeout=60, what="the leader's exit")
    assert alive(pid)
    return ref, pid


@pytest.fixture
def stranger() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A `sleep` in a cgroup named as another state dir's engine's, run ``n1``."""
    at = cgroups.parent()
    assert at is not None
    cg = at / cgroups.name(uuid.uuid4().hex, "web", "n1")
    cg.mkdir()
    proc = subprocess.Popen(["sleep", "600"])
    try:
        assert cgroups.join(cg, proc.pid)
        yield cg, proc
    finally:
        proc.kill()
        proc.wait()
        wait_for(lambda: not cgroups.members(cg), timeout=30, what="the stranger's end")
        cgroups.remove(cg)


def dead_ref() -> ProcessRef:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return ProcessRef(pid=int(out), start_time=time.time() - 1)


@WRITABLE
@pytest.mark.parametrize("forged", ["another state dir's", "the v2 root"])
def test_a_note_naming_a_cgroup_not_of_this_run_kills_nothing(
    rt: LocalBackend, stranger: tuple[Path, subprocess.Popen[bytes]], forged: str
) -> None:
    cg, proc = stranger
    named = cg if forged == "another state dir's" else cgroups.parent()
    # The note of a run n1 whose engine has ended: its teardown empties the cgroup it names.
    rt.notes.write(SpawnNote("n1", dead_ref(), {}, str(named)))
    rt.sweep("n1")
    assert alive(proc.pid) and proc.pid in cgroups.members(cg)
    assert cg.is_dir()
    assert not rt.notes.read_all()  # the note is gone: its engine ended, nothing is ours


@WRITABLE
def test_a_spawned_engine_is_in_its_cgroup_until_its_stop_removes_it(
    rt: LocalBackend, tmp_path: Path
) -> None:
    ref = rt.spawn(["sleep", "600"], dict(os.environ), name="web", nonce="n2",
                   log_path=tmp_path / "web.log")  # fmt: skip
    (note,) = rt.notes.read_all()
    assert note.cgroup is not None
    cg = Path(note.cgroup)
    assert cg.name == cgroups.name(str(stateid.peek(tmp_path)), "web", "n2")
    assert cgroups.members(cg) == [ref.pid]
    rt.stop(ref, "n2", 15, 10.0)
    assert not cg.exists() and not rt.notes.read_all()


# An engine that counts its stop signals: a real-time signal, which the kernel queues
# (SIGTERM's second send would merge with the first while pending), blocked and waited for.
COUNTS = """
import signal, sys
sig = signal.SIGRTMIN + 1
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
open(sys.argv[1] + ".ready", "w").close()
signal.sigwait([sig])
got = 1
while signal.sigtimedwait([sig], 1.0) is not None:  # a second send: microseconds after
    got += 1
with open(sys.argv[1], "w") as f:
    f.write(str(got))
"""


@WRITABLE
def test_an_engine_in_its_cgroup_gets_its_stop_signal_once(
    rt: LocalBackend, tmp_path: Path
) -> None:
    """The stop signal went to the engine's process group, then to each member of its
    cgroup, the engine among them: twice. A second SIGTERM or SIGINT is a forced exit to
    many servers (uvicorn's), and the demo engine, caught in Python's shutdown by it,
    wrote a traceback into its log (a CI run's tests/ux/test_ux_down.py)."""
    got = tmp_path / "got"
    ref = rt.spawn([sys.executable, "-c", COUNTS, str(got)], dict(os.environ), name="web",
                   nonce="n5", log_path=tmp_path / "web.log")  # fmt: skip
    wait_for(Path(f"{got}.ready").exists, timeout=60, what="the engine's signal mask")
    rt.stop(ref, "n5", signal.SIGRTMIN + 1, 30.0)
    assert got.read_text() == "1"


def test_where_no_cgroup_is_ours_an_engine_runs_as_before(tmp_path: Path) -> None:
    """A user who is not root (a user namespace's, when the tests run as root): no cgroup,
    no error, the engine spawned and stopped as ever."""
    script = (
        "import os, sys, uuid\n"
        "from pathlib import Path\n"
        "from controller.host import cgroups\n"
        "from controller.backends.local.runtime import LocalBackend\n"
        "from controller.store.config import stateid\n"
        "state = Path(sys.argv[1])\n"
        "stateid.ensure(state)\n"
        "rt = LocalBackend(state, 't-' + uuid.uuid4().hex[:12])\n"
        "ref = rt.spawn(['sleep', '600'], {}, name='web', nonce='n3',\n"
        "               log_path=state / 'web.log')\n"
        "(note,) = rt.notes.read_all()\n"
        "rt.stop(ref, 'n3', 15, 10.0)\n"
        "print(cgroups.parent(), note.cgroup, rt.alive(ref))\n"
    )
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)  # writable by the namespace's user, whose uid is unmapped
    wrap = ["unshare", "-U"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([*wrap, sys.executable, "-c", script, str(state)],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "None", "False"], proc.stdout
    assert "cgroup" not in proc.stderr, proc.stderr


@WRITABLE
def test_a_dead_leaders_escaped_child_gets_the_stop_signal_and_its_grace(
    rt: LocalBackend, tmp_path: Path, escapee: Escapee
) -> None:
    """systemd's KillMode=control-group: the stop signal reaches every member of the
    cgroup and the grace runs, its leader dead or not; SIGKILL only after it."""
    escapee.go()  # it ends as soon as its SIGTERM handler has written "term"
    ref, pid = escaped_engine(rt, tmp_path, escapee, "n4")
    (note,) = rt.notes.read_all()
    rt.stop(ref, "n4", 15, 120.0)
    assert escapee.termed() and escapee.ended(), "SIGKILLed with no stop signal"
    assert not alive(pid) and note.cgroup is not None and not Path(note.cgroup).exists()


@WRITABLE
def test_an_escaped_child_keeps_its_grace_once_its_leader_has_ended(
    rt: LocalBackend, tmp_path: Path, escapee: Escapee
) -> None:
    """The leader ends at once on its SIGTERM; its escaped child takes longer: the grace
    runs on for it (the stop waited for the leader alone, then SIGKILLed the child)."""
    ref = rt.spawn(escapee.argv("serve"), dict(os.environ), name="web", nonce="n6",
                   log_path=tmp_path / "web.log")  # fmt: skip
    pid = escapee.pid()
    stopping = threading.Thread(target=rt.stop, args=(ref, "n6", 15, 120.0))
    stopping.start()
    try:
        wait_for(escapee.termed, timeout=60, what="the child's SIGTERM")
        wait_for(lambda: not alive(ref.pid), timeout=60, what="the leader's end")
        assert alive(pid), "SIGKILLed once its leader had ended"
    finally:
        escapee.go()
        stopping.join(timeout=180)
    assert not stopping.is_alive() and escapee.ended()
    assert not alive(pid) and not rt.notes.read_all()


@WRITABLE
def test_a_deferred_stop_waits_for_the_cgroup_its_leader_left(
    rt: LocalBackend, tmp_path: Path, escapee: Escapee
) -> None:
    """The daemon's stop (``signal_stop``, then ``stopped`` each pass): a dead leader's
    escaped child gets the signal, and the stop waits until it has ended."""
    ref, pid = escaped_engine(rt, tmp_path, escapee, "n5")
    rec = Record(name="web", owner="t", node=rt.node, nonce="n5", ref=ref)
    assert not rt.stopped(rec), "its leader is gone, its child is not"
    assert rt.signal_stop(rec) and rt.remains(rec)
    wait_for(escapee.termed, timeout=60, what="the child's SIGTERM")
    assert not rt.stopped(rec), "its child is still ending"
    escapee.go()
    wait_for(lambda: rt.stopped(rec), timeout=60, what="the child's end")
    assert not rt.remains(rec)
    rt.teardown(rec)
    assert not alive(pid) and not rt.notes.read_all()
    assert not list(cgroups.parent().glob(f"{cgroups.PREFIX}{stateid.peek(tmp_path)}-*"))


NOTELESS = """
import json, os, sys
from pathlib import Path
from controller.backends.local.runtime import LocalBackend
state, node, nonce, *argv = sys.argv[1:]
rt = LocalBackend(Path(state), node)
ref = rt.spawn(argv, dict(os.environ), name="web", nonce=nonce, log_path=Path(state) / "web.log")
print(json.dumps([ref.pid, ref.start_time, rt.notes.read_all() == []]))
"""


@WRITABLE
def test_a_cgroup_no_note_names_is_found_by_its_name_and_emptied(
    rt: LocalBackend, tmp_path: Path, escapee: Escapee,
    stranger: tuple[Path, subprocess.Popen[bytes]],
) -> None:  # fmt: skip
    """The spawn note failed to write (ENOSPC), the pass that spawned the engine is gone,
    its leader died: the teardown of that run finds the cgroup by its name (this state
    dir's id, that nonce) and empties it; another state dir's of the same nonce stays."""
    other, proc = stranger  # another state dir's run "n1"
    env = {**os.environ, "RECONCILE_FAILPOINTS": "runtime.spawn.before_note=enospc",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", NOTELESS, str(tmp_path), rt.node, "n1",
                          *escapee.argv()], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout  # fmt: skip
    pid, start, noteless = json.loads(out.splitlines()[-1])  # after its warning
    assert noteless, "the failpoint left no note"
    ref = ProcessRef(pid=pid, start_time=start)
    child = escapee.pid()
    wait_gone(pid, timeout=60)  # the leader, reaped by whoever adopted it
    mine = cgroups.parent() / cgroups.name(str(stateid.peek(tmp_path)), "web", "n1")
    assert child in cgroups.members(mine)
    escapee.go()
    rt.stop(ref, "n1", 15, 120.0)
    assert not alive(child) and not mine.exists(), "the cgroup no note named was left"
    assert escapee.termed()
    assert alive(proc.pid) and other.is_dir()
