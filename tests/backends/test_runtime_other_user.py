"""A teardown by a reconcile that is not root, on an engine it did not spawn.

An ended engine stays a zombie until its parent reaps it: after `reconcile --once` exits,
its engines' parent is init (or a subreaper), which may take its time. To any user but
root a zombie's ``/proc/PID/environ`` reads EACCES (the kernel gives a process with no
memory to root), which the teardown took for a live engine it may not prove ours: a
non-root `reconcile down` signalled the engine, saw it end, and then said `not stopped:
... not dumpable`, keeping the record. Another uid is played, as in
tests/gateway/test_long_state_dir.py, by a root child that imports what it needs and
then setuid()s to nobody (a user namespace would not do: there the zombie is root's own).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import missing
import pytest
from procs import kill_marked, wait_gone

# As nobody: spawn an engine (a marked `sleep`, its session's leader) that this process
# never reaps, as init does not at once, then stop it through the local backend.
AS_NOBODY = """
import json, os, signal, sys
from pathlib import Path
from controller.backends.local.runtime import MARKER, STATE_MARKER, LocalBackend
from controller.errors import NotProvenOurs
from controller.host import procstat
from controller.host.procs import identity

state, node, gid, uid = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.setgid(gid); os.setuid(uid)
rt = LocalBackend(state, node)
env = {MARKER: f"{node}/web/n1", STATE_MARKER: str(state.resolve()), "PATH": "/usr/bin:/bin"}
pid = os.posix_spawn(sys.argv[5], ["sleep", "600"], env, setsid=True)
print(pid, flush=True)
ref = identity(pid)
try:
    rt.stop(ref, "n1", signal.SIGTERM, 30.0)
    said = "stopped"
except NotProvenOurs as exc:
    said = f"refused: {exc}"
st = procstat.stat(pid)
os.waitpid(pid, 0)
print(json.dumps({"said": said, "state": None if st is None else st.state}), flush=True)
"""


@pytest.fixture
def nobody_state() -> Iterator[Path]:
    """A state dir nobody may write, in a folder nobody may reach (tmp_path's parents are
    root's alone)."""
    if os.geteuid() != 0:
        missing.skip("root (to play another user by setuid)", "run the tests as root")
    who = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="reconcile-other-user-"))
    os.chmod(top, 0o755)
    state = top / "state"
    state.mkdir(mode=0o700)
    os.chown(state, who.pw_uid, who.pw_gid)
    yield state
    shutil.rmtree(top)


def test_a_non_root_stop_of_an_engine_it_did_not_spawn_ends_at_its_exit(
    nobody_state: Path,
) -> None:
    who = pwd.getpwnam("nobody")
    node = f"t-{uuid.uuid4().hex[:12]}"
    sleep = shutil.which("sleep") or "/bin/sleep"
    argv = [sys.executable, "-c", AS_NOBODY, str(nobody_state), node,
            str(who.pw_gid), str(who.pw_uid), sleep]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_marked(f"{node}/")  # an engine a failure left (the script reaps its own)
    assert proc.returncode == 0, err
    engine, result = out.splitlines()
    wait_gone(int(engine))  # reaped by its parent, which has exited
    done = json.loads(result)
    # The engine ended by its stop signal and was a zombie (unreaped) when the stop returned.
    assert done == {"said": "stopped", "state": "Z"}, done
