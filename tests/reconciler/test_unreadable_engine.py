"""An engine whose environment reconcile's user may not read is never said stopped.

A file-capability program (`setcap cap_net_bind_service+ep`, to bind port 80) is not
dumpable: only root outside any user namespace reads its /proc/PID/environ, where the
marker that proves it reconcile's engine is. The teardown read "unreadable" as "not
ours", sent no signal, and returned as if done: `down` printed "stopped" and dropped the
record while the engine ran on, lost (invariant 1). A user namespace (`unshare -U`)
makes an unprivileged reconcile out of root's test run, as tests/procs.py's
``unprivileged`` does; the test itself, root, reads everything.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import missing
import pytest
import warmcli
from procs import alive, environ, marked_pids, wait_gone

if TYPE_CHECKING:
    from conftest import Reconcile

READY = {"periodSeconds": 0.2}  # no probe: Ready once spawned


def capable_sleep(folder: Path) -> Path:
    """A copy of sleep with a file capability: not dumpable, as a setcap'd engine is."""
    setcap = shutil.which("setcap")
    if setcap is None:
        missing.skip("setcap", "apt-get install libcap2-bin")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing.skip("root and unshare (a file capability, a user namespace)", "run as root")
    copy = folder / "capped-sleep"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", copy)
    subprocess.run([setcap, "cap_net_bind_service+ep", str(copy)], check=True)
    return copy


# Runs each argv in turn, inside the one user namespace: another namespace's reconcile
# could read no engine's environment (a sibling namespace has no CAP_SYS_PTRACE over it).
RUN_EACH = (
    "import json, subprocess, sys\n"
    "done = [subprocess.run(a, capture_output=True, text=True, stdin=subprocess.DEVNULL)"
    " for a in json.loads(sys.argv[1])]\n"
    "print(json.dumps([[d.returncode, d.stdout, d.stderr] for d in done]))\n"
)
# The module's warm CLI (tests/warmcli.py) inside a user namespace of its own, started at
# the first call that fits it: a cold call's CPU is mostly imports, and these are ~30.
_nobody: warmcli.Zygote | None = None


@pytest.fixture(scope="module", autouse=True)
def _nobody_ended() -> Iterator[None]:
    global _nobody
    yield
    if _nobody is not None:
        _nobody.close()
        _nobody = None


def as_nobody(
    rc: Reconcile, *calls: list[str], env: Mapping[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """CLI calls in a user namespace: a reconcile that is not root, as in
    `unshare -U sh -c 'reconcile --once; reconcile down'`; ``env`` added to each's. Warm
    (the module's one namespace) where the environment lets a fork serve them, else cold,
    each in turn in one new namespace."""
    argvs, full = [rc.argv(*args) for args in calls], {**rc.env, **(env or {})}
    warm = _warm(full)
    if warm is not None:
        out = [warm.run(a, env=full, cwd=rc.tmp, timeout=240) for a in argvs]
    else:
        done = subprocess.run(
            ["unshare", "-U", sys.executable, "-c", RUN_EACH, json.dumps(argvs)],
            capture_output=True, text=True, env=full, cwd=rc.tmp,
            timeout=240, stdin=subprocess.DEVNULL, check=True,
        )  # fmt: skip
        out = [subprocess.CompletedProcess(a, c, o, e) for a, (c, o, e) in
               zip(argvs, json.loads(done.stdout), strict=True)]  # fmt: skip
    for one in out:
        assert "Traceback" not in one.stderr, one
    return out


def _warm(env: Mapping[str, str]) -> warmcli.Zygote | None:
    """The module's zygote in its user namespace, if ``env`` lets it serve (see
    warmcli.COLD)."""
    global _nobody
    if os.environ.get(warmcli.OFF):
        return None
    if _nobody is None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
        _nobody = warmcli.Zygote(base, prefix=["unshare", "-U"])
    return _nobody if _nobody.fits(env) else None


def spawned(rc: Reconcile, name: str) -> int:
    """The pid of the engine the journal says ``name`` spawned (its record may be gone)."""
    (pid,) = [int(e["outcome"].split()[-1]) for e in rc.events(name)
              if e["outcome"].startswith("spawned pid ")]  # fmt: skip
    return pid


def test_an_engine_not_provably_ours_is_kept_and_said_not_stopped(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    rc.write("plain", command=["sleep", "600"], readiness=READY, basePort=rc.port + 4)
    started, down = as_nobody(rc, ["--once"], ["down"])
    assert started.returncode == 0, started
    capped = rc.record("capped")
    assert capped is not None, (started, down)
    pid, other = capped["ref"]["pid"], spawned(rc, "plain")
    assert "RECONCILE_INSTANCE" in environ(pid)  # ours, and root reads it
    assert down.returncode == 1, down
    assert "stopped plain" in down.stdout and "capped" not in down.stdout, down
    said = f"reconcile: capped: not stopped: pid {pid} runs"
    assert said in down.stderr and "is not readable to this user" in down.stderr, down
    assert "Run reconcile as the user that started it, or as root" in down.stderr, down
    codes = rc("down", "--help", check=0).out.split("exit codes:")[1]
    assert "an engine is not stopped" in codes, codes  # its help named no such 1
    assert alive(pid) and not alive(other), down
    kept = rc.record("capped")
    assert kept is not None and kept["phase"] == capped["phase"], kept
    assert kept["ref"] == capped["ref"] and "not stopped: " in kept["message"], kept

    # A pass is not stopped by it: the manifest gone, the other deployment starts; the
    # kept one is tried again, said as a failure of the pass. A drain's eviction stops
    # the others and says it did not stop this one. Journalled once in all.
    (rc.manifests / "capped.yaml").unlink()
    rc.write("later", command=["sleep", "600"], readiness=READY, basePort=rc.port + 8)
    again, evict, _ = as_nobody(rc, ["--once"], ["drain", "--evict"], ["uncordon"])
    assert again.returncode == 1, again
    assert f"error: capped: not stopped: pid {pid} runs" in again.stderr, again
    later = spawned(rc, "later")
    assert evict.returncode == 1 and "evicted later" in evict.stdout, evict
    assert "capped" not in evict.stdout and said in evict.stderr, evict
    assert alive(pid) and rc.record("capped") is not None and not alive(later), evict
    told = [e for e in rc.events("capped") if e.get("outcome") == "not stopped"]
    assert len(told) == 1 and f"pid {pid}" in told[0]["error"], told

    rc.down()  # root proves it ours: stopped, and its record dropped
    assert not alive(pid) and rc.record("capped") is None


def test_a_kept_engine_that_ends_is_said_stopped_at_the_next_pass(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """Its "not stopped" message is no longer true once the engine is gone (ended by
    root, or on its own): the next pass says it stopped and drops its record."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    rc.write("plain", command=["sleep", "600"], readiness=READY, basePort=rc.port + 4)
    (started,) = as_nobody(rc, ["--once"])
    assert started.returncode == 0, started
    (rc.manifests / "capped.yaml").unlink()
    (refused,) = as_nobody(rc, ["--once"])
    kept = rc.record("capped")
    assert refused.returncode == 1 and kept is not None, refused
    assert "not stopped: " in kept["message"], kept
    pid = kept["ref"]["pid"]
    os.kill(pid, signal.SIGKILL)  # root ends it
    wait_gone(pid)
    (again,) = as_nobody(rc, ["--once"])
    assert again.returncode == 0 and rc.record("capped") is None, again
    ended = [e["outcome"] for e in rc.events("capped")][-2:]
    assert ended[0] == "stopped; record dropped", rc.events("capped")
    rc.down()


# A backend that spawns the capable engine itself, then stops it (the daemon's case: it
# started what a manifest change stops): prints whether the environment read, the pid,
# and whether it outlived the stop.
OWN_CHILD = """
import json, signal, sys
from pathlib import Path
from controller.backends.local.runtime import LocalBackend
from controller.host.procs import process_alive
state, node, program = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rt = LocalBackend(state, node)
ref = rt.spawn([program, "600"], {}, name="own", nonce="n1", log_path=state / "own.log")
try:
    readable = bool(open(f"/proc/{ref.pid}/environ", "rb").read())
except PermissionError:
    readable = False
rt.stop(ref, "n1", signal.SIGTERM, 5.0)
print(json.dumps([readable, ref.pid, process_alive(ref)]))
"""


def test_its_own_child_is_ours_though_its_environment_is_unreadable(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """An unreaped child of ours is ours whatever its environment says: a daemon stops
    the capable engine it started (the old teardown sent it nothing and returned)."""
    program = capable_sleep(tmp_path)
    rc, state = reconcile, tmp_path / "own-state"
    state.mkdir()
    done = subprocess.run(
        ["unshare", "-U", sys.executable, "-c", OWN_CHILD, str(state), rc.node, str(program)],
        capture_output=True, text=True, env=rc.env, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done
    readable, pid, outlived = json.loads(done.stdout)
    assert not readable and not outlived and not alive(pid), done


# Both paths (/proc, and psutil's for hosts without it) on a capable engine and a pid
# that is gone: what environ_of answers for each, as words.
ANSWERS = """
import json, subprocess, sys
from controller.host import procpsutil, procscan

child = subprocess.Popen([sys.argv[1], "600"])
def answer(pid):
    try:
        return "gone" if procscan.environ_of(pid) is None else "read"
    except PermissionError:
        return "denied"
try:
    out = {}
    for active in (False, True):
        procpsutil.ACTIVE = active
        out[str(active)] = [answer(child.pid), answer(1 << 30), procscan.environ(child.pid)]
    print(json.dumps(out))
finally:
    child.kill()
    child.wait()
"""


def test_an_unreadable_environment_is_not_taken_for_a_gone_process(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    program = capable_sleep(tmp_path)
    done = subprocess.run(
        ["unshare", "-U", sys.executable, "-c", ANSWERS, str(program)],
        capture_output=True, text=True, env=reconcile.env, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done
    # procscan.environ (the marker scan's) still skips both: neither is found as ours
    assert json.loads(done.stdout) == {p: ["denied", "gone", None] for p in ("False", "True")}


# -- an engine whose record is lost: found by its spawn note -------------------------------


def outcomes(rc: Reconcile, name: str) -> list[str]:
    """The journal's spawns and adoptions of ``name``, in order."""
    return [e["outcome"] for e in rc.events(name)
            if e["outcome"].startswith(("spawned pid ", "adopted pid "))]  # fmt: skip


def test_an_unreadable_engine_whose_record_is_lost_is_adopted_not_started_twice(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """Its marker unreadable, no scan but root's found it: the next pass started a second
    engine beside it, the first held its devices unseen. Its spawn note names it now."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    (started,) = as_nobody(rc, ["--once"])
    assert started.returncode == 0, started
    pid = spawned(rc, "capped")
    rc.record_path("capped").unlink()  # deleted, or a state dir restored from a backup
    plan, again = as_nobody(rc, ["plan"], ["--once"])
    assert f"the pass adopts its engine (pid {pid})" in plan.stdout, plan
    assert again.returncode == 0, again
    adopted = rc.record("capped")
    assert adopted is not None and adopted["ref"]["pid"] == pid, (again, adopted)
    (adopt,) = [e for e in rc.events("capped") if e["outcome"] == f"adopted pid {pid}"]
    assert "its spawn note names this instance" in adopt["reason"], adopt
    assert marked_pids(f"{rc.node}/capped/") == {pid}, again  # none started beside it
    assert outcomes(rc, "capped") == [f"spawned pid {pid}", f"adopted pid {pid}"]

    # Its manifest gone too, it is adopted by no pass, and reaped by none (not proven ours).
    rc.record_path("capped").unlink()
    (rc.manifests / "capped.yaml").unlink()
    rc.write("plain", command=["sleep", "600"], readiness=READY, basePort=rc.port + 4)
    spared, down = as_nobody(rc, ["--once"], ["down"])
    assert spared.returncode == 0 and down.returncode == 0, (spared, down)
    assert "stopped plain" in down.stdout and "capped" not in down.stdout, down
    assert alive(pid) and rc.record("capped") is None, (spared, down)
    rc.down()  # root reads its marker: reaped as this set's engine with no record
    assert not alive(pid)


def test_an_unreadable_engine_a_killed_pass_never_recorded_is_adopted(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """A pass SIGKILLed between the spawn and the record's write left a reservation whose
    engine no scan but root's found: the next pass dropped it and started a second one."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    crash = {"RECONCILE_FAILPOINTS": "executor.spawn.before_record=kill"}
    (killed,) = as_nobody(rc, ["--once"], env=crash)
    assert killed.returncode == -signal.SIGKILL, killed
    (pid,) = marked_pids(f"{rc.node}/capped/")  # root reads its marker
    reserved = rc.record("capped")
    assert reserved is not None and reserved.get("ref") is None, reserved
    (again,) = as_nobody(rc, ["--once"])
    assert again.returncode == 0, again
    adopted = rc.record("capped")
    assert adopted is not None and adopted["ref"]["pid"] == pid, (again, adopted)
    assert marked_pids(f"{rc.node}/capped/") == {pid}, again
    assert outcomes(rc, "capped") == [f"adopted pid {pid}"]
    rc.down()
    assert not alive(pid)


def test_a_pass_killed_before_its_spawn_note_leaves_no_unreadable_engine_unnoted(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """A pass SIGKILLed after its fork and before its spawn note's write (3 ms at the
    median, up to 80 ms on a loaded box) left an engine that no record and no note named:
    the next pass released the reservation and started a second engine beside it, the
    first holding its devices unseen. An engine now execs only once its note is written."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    crash = {"RECONCILE_FAILPOINTS": "runtime.spawn.before_note=kill"}
    (killed,) = as_nobody(rc, ["--once"], env=crash)
    assert killed.returncode == -signal.SIGKILL, killed
    (again,) = as_nobody(rc, ["--once"])
    assert again.returncode == 0, again
    engine = rc.record("capped")
    assert engine is not None and engine["ref"] is not None, (again, engine)
    pid = engine["ref"]["pid"]
    assert marked_pids(f"{rc.node}/capped/") == {pid}, again  # root reads every marker
    rc.down()
    assert not alive(pid)


# Not dumpable, it listens on argv[1] until killed: a foreign process this user cannot read.
FOREIGN = (
    "import ctypes, socket, sys, time\n"
    "ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE\n"
    "s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def test_a_foreign_unreadable_process_a_stale_note_names_is_neither_adopted_nor_killed(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """A note names one process: its pid AND start time. A foreign one that took the pid
    (and the engine's port) after the engine ended is not it."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    (started,) = as_nobody(rc, ["--once"])
    assert started.returncode == 0, started
    engine = rc.record("capped")
    assert engine is not None, started
    pid, port = engine["ref"]["pid"], engine["port"]
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    rc.record_path("capped").unlink()
    foreign = rc.spawn([sys.executable, "-c", FOREIGN, str(port)])
    rc.wait_for(lambda: not rc.bindable(port), what=f"the foreign listener on {port}")
    # The engine's note, its pid now the foreign process's: a pid reused.
    (note,) = (rc.state / "spawnnotes").glob("*.json")
    forged = json.loads(note.read_text())
    forged["ref"] |= {"pid": foreign.pid}
    note.write_text(json.dumps(forged))
    (again,) = as_nobody(rc, ["--once"])
    assert again.returncode == 0, again
    fresh = rc.record("capped")
    assert fresh is not None and fresh["ref"]["pid"] not in (pid, foreign.pid), (again, fresh)
    assert fresh["port"] != port, fresh  # the foreign listener keeps its port
    assert alive(foreign.pid), again
    assert outcomes(rc, "capped") == [f"spawned pid {pid}", f"spawned pid {fresh['ref']['pid']}"]
    rc.down()  # a teardown removes the notes whose process is gone: the forged one too
    assert alive(foreign.pid) and not note.exists()
    assert not list((rc.state / "spawnnotes").glob("*.json"))


def _undeclared(rc: Reconcile, tmp_path: Path) -> dict[str, Any]:
    """`capped` started by a pass that cannot read it, then its record lost and its
    manifest gone: its record as it was."""
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    (started,) = as_nobody(rc, ["--once"])
    engine = rc.record("capped")
    assert started.returncode == 0 and engine is not None, started
    rc.record_path("capped").unlink()
    (rc.manifests / "capped.yaml").unlink()
    return engine


def test_an_undeclared_unreadable_engine_is_said_with_its_holdings_and_next_move(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """Its record lost and its manifest gone, no pass adopts it or stops it (not proven
    ours): it held its port with nothing said by `--once` or the journal. Each pass says
    what holds the port, why it is left, and the next move; the journal says it once."""
    rc = reconcile
    engine = _undeclared(rc, tmp_path)
    pid, port = engine["ref"]["pid"], engine["port"]
    rc.write("plain", command=["sleep", "600"], readiness=READY, basePort=rc.port + 4)
    other = tmp_path / "other-set"  # another manifest set: the engine is not its to judge
    rc.write("side", folder=other, command=["sleep", "600"], readiness=READY,
             basePort=rc.port + 8)  # fmt: skip
    theirs, first, second = as_nobody(rc, ["--once", "-f", str(other)], ["--once"], ["--once"])
    assert theirs.returncode == 0 and "capped" not in theirs.stderr, theirs
    note = rc.state / "spawnnotes" / f"{engine['nonce']}.json"
    assert note.exists(), sorted((rc.state / "spawnnotes").iterdir())
    for one in (first, second):
        assert one.returncode == 0, one
        (said,) = [line for line in one.stderr.splitlines() if line.startswith("warning: capped:")]
        assert f"engine pid {pid} holds port {port} with no record" in said, said
        assert f"spawn note {note} names it instance capped" in said, said
        assert "cannot prove it its own, and neither adopts nor stops it" in said, said
        assert f"`kill {pid}`" in said and "run reconcile as root" in said, said
    told = [e for e in rc.events("capped") if e["action"] == "spare"]
    assert [e["outcome"] for e in told] == [f"left running: pid {pid}"], told
    assert f"holds port {port}" in told[0]["reason"], told
    shown = rc("events", "capped", check=0).out  # where a person looks for it later
    assert f"left running: pid {pid}" in shown and f"`kill {pid}`" in shown, shown
    assert alive(pid) and rc.record("capped") is None
    rc.down()  # root reads its marker: reaped as this set's engine with no record
    assert not alive(pid)
    rc.down("-f", str(other))
    assert rc.record("side") is None


def test_devices_shows_what_an_engine_found_by_its_spawn_note_alone_holds(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """Its record lost and its manifest gone, the engine runs on holding a device and a
    port, which every pass counts held (it spares it), yet `reconcile devices` showed the
    device free and the port unheld: a person looking for who holds the GPU found no one.
    It shows the engine there with its pid, reading only (no note removed, no signal)."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY,
             devices={"count": 1})  # fmt: skip
    (started,) = as_nobody(rc, ["--once"])
    engine = rc.record("capped")
    assert started.returncode == 0 and engine is not None, started
    pid, port, (device,) = engine["ref"]["pid"], engine["port"], engine["devices"]
    rc.record_path("capped").unlink()
    (rc.manifests / "capped.yaml").unlink()
    note = rc.state / "spawnnotes" / f"{engine['nonce']}.json"
    shown, table = as_nobody(rc, ["devices", "-o", "json"], ["devices"])
    assert shown.returncode == 0 and table.returncode == 0, (shown, table)
    holder = f"capped (no record, found by its spawn note; engine pid {pid})"
    doc = json.loads(shown.stdout)
    (item,) = [d for d in doc["devices"] if d["device"] == device]
    assert item["held_by"] == [holder], item
    assert {"port": port, "held_by": holder, "phase": "Unknown"} in doc["ports"], doc
    assert f"engine pid {pid}" in table.stdout, table
    as_root = rc("devices", "-o", "json", check=0).json()  # root reads its marker
    (item,) = [d for d in as_root["devices"] if d["device"] == device]
    assert item["held_by"] == [f"capped (no record; engine pid {pid})"], item
    assert alive(pid) and note.exists(), note  # a read verb: nothing signalled, nothing removed
    rc.down()  # root reads its marker: reaped as this set's engine with no record
    assert not alive(pid)


def test_status_and_describe_point_to_an_engine_with_no_record(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """Its record lost and its manifest gone, the engine holds this node's port (and
    devices), which `--once` and `devices` say, while `status` showed `No deployments.`
    and `describe NAME` "no deployment named": each now points to it in one line (on
    stderr: stdout stays a table or a list), as root and as a user that cannot read it."""
    rc = reconcile
    engine = _undeclared(rc, tmp_path)
    pid, port = engine["ref"]["pid"], engine["port"]
    note = rc.state / "spawnnotes" / f"{engine['nonce']}.json"
    said = f"warning: capped: engine pid {pid} holds port {port} with no record: its spawn "
    said += f"note {note} names it; `reconcile devices` shows what it holds"
    calls = (["status"], ["status", "-o", "json"], ["status", "capped"], ["describe", "capped"])
    for done in as_nobody(rc, *calls):
        assert done.returncode == (1 if "capped" in done.args else 0), done
        lines = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
        assert lines == [said + ", and `reconcile events capped` what the passes said of it"]
    assert json.loads(as_nobody(rc, ["status", "-o", "json"])[0].stdout) == []
    assert said in rc("status", check=0).err  # root: the same, read from the same note
    assert said not in rc("status", "-l", "team=x", check=0).err  # its labels are unknown
    assert alive(pid) and note.exists(), note  # read verbs: nothing signalled, nothing removed
    rc.down()  # root reads its marker: reaped as this set's engine with no record
    assert not alive(pid)
    assert "with no record" not in rc("status", check=0).err


def test_a_wait_says_a_torn_records_engine_was_adopted_by_its_spawn_note(
    reconcile: Reconcile, tmp_path: Path
) -> None:
    """`--once --wait` said "adopted, as its marker names it" of an engine whose marker
    this user may not read: its spawn note named it."""
    rc = reconcile
    rc.write("capped", command=[str(capable_sleep(tmp_path)), "600"], readiness=READY)
    (started,) = as_nobody(rc, ["--once"])
    assert started.returncode == 0, started
    pid = spawned(rc, "capped")
    rc.record_path("capped").write_text("{")  # torn under its engine
    (waited,) = as_nobody(rc, ["--once", "--wait", "--timeout", "60s"])
    assert waited.returncode == 0, waited
    (said,) = [line for line in waited.stderr.splitlines() if "record moved to" in line]
    assert f"its engine (pid {pid}) adopted, as its spawn note (this user may not read its " \
        "environment) names it" in said, said  # fmt: skip
    assert "marker" not in said, said
    assert marked_pids(f"{rc.node}/capped/") == {pid}, waited
    rc.down()
    assert not alive(pid)
