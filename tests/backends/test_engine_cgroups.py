"""An engine's cgroup (controller/host/cgroups.py) at the backend: only a cgroup named for
this state dir and that run is ever killed, and where no cgroup is ours to write an
engine runs as before. The end-to-end case (`down` and an escaped child) is
tests/integration/test_engine_cgroup.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import alive, kill_marked, wait_for

from controller.backends.local.runtime import LocalBackend
from controller.core.state import ProcessRef
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
