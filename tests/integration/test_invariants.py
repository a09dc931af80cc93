"""DESIGN.md's invariants 1-11, one test each, through the real CLI and real processes.

Each test would fail without its invariant. Engines are the demo engine or tiny
Python scripts; ports, files and signals are real; GPUs come from the static inventory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from procs import IGNORE_TERM, alive, environ, wait_for, wait_gone

from controller.core.manifest.specs import spec_document
from controller.core.state import Phase, ProbeConfig, ProcessRef, Record
from controller.host.procs import identity
from controller.store.lock import FileLock
from controller.store.sources.manifests import load

# An engine with a child in its own group that ignores SIGTERM.
WITH_CHILD = """
import os, signal, sys, time
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(300); os._exit(0)
import controller.demo.engine as e
e.main(["--port", sys.argv[1]])
"""


def holders(status: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, item in status.items():
        for key in item["devices"]:
            out.setdefault(key, []).append(name)
    return out


def dead_ref() -> ProcessRef:
    """The identity of a process that has exited (a SIGKILLed reconcile, say)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return ProcessRef(pid=int(proc.stdout), start_time=time.time() - 1)


def reservation(reconcile: Any, name: str, *, nonce: str, port: int, **fields: Any) -> Record:
    """The record a pass writes before it spawns, as if its maker died right after."""
    loaded = load([reconcile.manifests])
    entry = loaded.entries[name]
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "name": name,
        "owner": str(reconcile.manifests),
        "source": entry.source,
        "spec_hash": entry.hash,
        "stored_spec": spec_document(entry.deployment.spec),
        "ready_deadline_seconds": 30.0,
        "models": (name,),
        "node": reconcile.node,
        "engine": "command",
        "nonce": nonce,
        "reserved_by": dead_ref(),
        "port": port,
        "phase": Phase.RESERVED,
        "probe": ProbeConfig(http=(("/health", None),), period_seconds=0.2),
        "grace_seconds": 2.0,
        "reserved_at": now,
        "ready_deadline_at": now + timedelta(seconds=30),
    }
    values.update(fields)
    return Record(**values)


def engine_with_marker(reconcile: Any, name: str, nonce: str, port: int) -> Any:
    """An engine as a dead pass would have left it: its marker, no handle in any record."""
    env = {
        **reconcile.env,
        "RECONCILE_INSTANCE": f"{reconcile.node}/{name}/{nonce}",
        "RECONCILE_STATE": str(reconcile.state.resolve()),
    }
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port)]
    proc = reconcile.spawn(argv, env=env, start_new_session=True)
    wait_for(lambda: not reconcile.bindable(port), what="the stray engine to listen")
    return proc


def check_converged(reconcile: Any) -> None:
    """Invariant 3's promises, read from the state dir and /proc."""
    store = reconcile.store()
    snap = store.load()
    assert not snap.problems, snap.problems
    nonces = {r.nonce for r in snap.records.values()}
    for rec in snap.records.values():
        assert rec.phase is not Phase.RESERVED or alive(rec.reserved_by.pid), rec
    for pid in reconcile.pids():
        marker = environ(pid).get("RECONCILE_INSTANCE", "")
        assert marker.rsplit("/", 1)[-1] in nonces, f"pid {pid} ({marker}) has no record"


# -- 1 ---------------------------------------------------------------------------------------


def test_1_no_device_held_twice_unless_both_shareable(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0,nvidia:1,cpu:0"
    for name in ("a", "b", "c"):
        reconcile.write(name, devices={"count": 1, "kind": "nvidia"})
    for name in ("s1", "s2"):
        reconcile.write(name, devices={"count": 1, "kind": "cpu", "shareable": True})
    reconcile.write("x", devices={"count": 1, "kind": "cpu"})
    reconcile.once(check=1)
    status = reconcile.status()
    held = holders(status)
    assert sorted(held["nvidia:0"] + held["nvidia:1"]) == ["a", "b"]
    assert len(held["nvidia:0"]) == len(held["nvidia:1"]) == 1
    assert sorted(held["cpu:0"]) == ["s1", "s2"]  # both shareable: they stack
    assert status["c"]["phase"] == status["x"]["phase"] == "Pending"
    assert "held by a [nvidia:0]; b [nvidia:1]" in status["c"]["message"]
    assert "held by s1 [cpu:0]; s2 [cpu:0]" in status["x"]["message"]
    seen = {environ(status[n]["pid"])["CUDA_VISIBLE_DEVICES"] for n in ("a", "b")}
    assert seen == {"0", "1"}
    reconcile.down()


# -- 2 ---------------------------------------------------------------------------------------


def test_2_no_port_held_twice_and_foreign_ports_never_handed_out(reconcile: Any) -> None:
    base = reconcile.port
    foreign = reconcile.listen(base)  # a foreign listener
    bound = socket.socket()  # bound, not listening: invisible in /proc/net, caught by bind
    bound.bind(("127.0.0.1", base + 1))
    try:
        reconcile.write("x", basePort=base)
        reconcile.write("y", port=base, basePort=None)
        reconcile.once(check=1)
        x = reconcile.status()["x"]
        assert x["port"] == base + 2
        reconcile.write("z", port=base + 2, basePort=None)
        reconcile.once(check=1)
        status = reconcile.status()
        assert status["y"]["phase"] == status["z"]["phase"] == "Pending"
        # this test's own process listens there: named by its pid, which /proc shows
        assert f"port {base} is in use by pid " in status["y"]["message"], status["y"]
        assert f"port {base + 2} is held by deployment x" in status["z"]["message"]
        ports = [i["port"] for i in status.values() if i["port"] is not None]
        assert len(ports) == len(set(ports)) == 1
        with socket.create_connection(("127.0.0.1", base), timeout=5):
            pass  # the foreign listener is untouched
    finally:
        foreign.close()
        bound.close()
    reconcile.down()


# An engine that binds its port only once the test opens a gate file (as vLLM binds only
# after loading its model): the window in which a foreign process takes the leased port.
GATED = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'controller.demo.engine', *sys.argv[2:]])"
)


def test_2_a_port_taken_before_the_engine_bound_it_moves_it_without_a_crash(
    reconcile: Any,
) -> None:
    """A foreign process took the leased port after reconcile chose it and before the
    engine bound it: the engine exits "address in use" before it was ever Ready. That
    once counted as a crash (restart 1, a back-off) before it moved: it moves now,
    with neither, saying so in an event."""
    rc = reconcile
    gate = rc.tmp / "gate"
    command = [sys.executable, "-c", GATED, str(gate), "--port", "{port}"]
    rc.write("web", engine="command", command=command)
    rc.once(check=0)
    first = rc.record("web")
    assert first["phase"] == "Starting", first
    foreign = rc.listen(first["port"])  # the foreign process, on the engine's port
    try:
        gate.touch()
        rc.wait_gone(first["ref"]["pid"])  # "address already in use"
        rc.converge()
        web = rc.record("web")
        assert web["port"] != first["port"] and web["restarts"] == 0, web
        assert web["phase"] == "Ready" and web["last_exit"] is None, web
        events = rc.events("web")
        assert [e for e in events if e["action"] == "fail"] == [], events
        moved = [e for e in events if f"port {first['port']} was taken" in e["reason"]]
        assert moved and "another port" in moved[0]["reason"], events
        with socket.create_connection(("127.0.0.1", first["port"]), timeout=5):
            pass  # the foreign listener is untouched
    finally:
        foreign.close()
    rc.down()


# Exits 1 on its first run (a crash of its own), then runs as GATED.
CRASHES_ONCE = (
    "import os, sys\n"
    "if not os.path.exists(sys.argv[1] + '.ran'):\n"
    "    open(sys.argv[1] + '.ran', 'w').close(); sys.exit(1)\n" + GATED
)


def test_2_a_port_move_keeps_the_restart_count(reconcile: Any) -> None:
    """The restart after a crash found its port taken before the engine bound it: the
    engine moved to another port and its count started again at 0, as if its spec had
    changed (Kubernetes resets restartCount only with a new pod template). It goes on."""
    rc = reconcile
    gate = rc.tmp / "gate"
    command = [sys.executable, "-c", CRASHES_ONCE, str(gate), "--port", "{port}"]
    rc.write("web", engine="command", command=command)

    def restarted() -> dict[str, Any] | None:
        rc.once(check=None)
        rec = rc.record("web")
        alive = rec is not None and rec["ref"] is not None and rc.alive(rec["ref"]["pid"])
        return rec if alive and rec["restarts"] == 1 and rec["phase"] == "Starting" else None

    first = rc.wait_for(restarted, what="web restarted once, waiting at its gate")
    foreign = rc.listen(first["port"])  # the foreign process, on the engine's port
    try:
        gate.touch()
        rc.wait_gone(first["ref"]["pid"])  # "address already in use"
        rc.converge()
        web = rc.record("web")
        assert web["port"] != first["port"] and web["phase"] == "Ready", web
        assert web["restarts"] == 1, web  # the crash's, kept through the move
        moved = [e for e in rc.events("web") if f"port {first['port']} was taken" in e["reason"]]
        assert moved and moved[0]["outcome"] == "Pending for another port", moved
    finally:
        foreign.close()
    rc.down()


# Exits 1 on its first two runs, then serves (the demo engine).
CRASHES_TWICE = (
    "import os, sys\n"
    "runs = sys.argv[1]\n"
    "n = int(open(runs).read()) if os.path.exists(runs) else 0\n"
    "if n < 2:\n"
    "    open(runs, 'w').write(str(n + 1)); sys.exit(1)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'controller.demo.engine', *sys.argv[2:]])"
)


def test_2_a_restart_onto_a_taken_port_moves_it_and_keeps_the_count(reconcile: Any) -> None:
    """A crash-looping engine's port taken during its back-off: the restart finds it bound
    (the launch's bind probe), starts nothing and is placed on another port. The count
    went back to 0 there; it goes on (2: the restart the move carried out)."""
    rc = reconcile
    runs = rc.tmp / "runs"
    command = [sys.executable, "-c", CRASHES_TWICE, str(runs), "--port", "{port}"]
    rc.write("web", engine="command", command=command)

    def backing_off() -> dict[str, Any] | None:
        rc.once(check=None)
        rec = rc.record("web")
        return rec if rec is not None and rec["phase"] == "BackOff" else None

    first = rc.wait_for(backing_off, what="web backing off after its second crash")
    assert first["restarts"] == 1 and first["port"] is not None, first
    foreign = rc.listen(first["port"])  # taken while the engine waits out its back-off
    try:
        rc.converge()
        web = rc.record("web")
        assert web["port"] != first["port"] and web["phase"] == "Ready", web
        assert web["restarts"] == 2, web
        taken = f"port {first['port']} was taken by another process while the engine was down"
        said = [e for e in rc.events("web") if e["reason"] == taken]
        assert said and said[0]["outcome"] == "Pending for another port", rc.events("web")
    finally:
        foreign.close()
    rc.down()


# -- 3 ---------------------------------------------------------------------------------------


def test_3_dead_makers_and_orphans_resolve_in_the_next_pass(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0"
    base = reconcile.port
    reconcile.write("adopt", basePort=base)
    reconcile.write("fresh", basePort=base + 3, devices={"count": 1})
    store = reconcile.store()
    # adopt: its maker died after the spawn and before recording the engine's pid
    stray = engine_with_marker(reconcile, "adopt", "n-adopt", base)
    store.write(reservation(reconcile, "adopt", nonce="n-adopt", port=base))
    # fresh: its maker died before spawning; the reservation holds the only GPU
    store.write(
        reservation(reconcile, "fresh", nonce="n-fresh", port=base + 3, devices=("nvidia:0",))
    )
    # orphan: an engine whose record never got written
    orphan = engine_with_marker(reconcile, "ghost", "n-ghost", base + 6)

    reconcile.converge()
    status = reconcile.status()
    assert status["adopt"]["pid"] == stray.pid and status["adopt"]["phase"] == "Ready"
    assert status["fresh"]["devices"] == ["nvidia:0"] and status["fresh"]["phase"] == "Ready"
    assert reconcile.record("fresh")["nonce"] != "n-fresh"
    wait_gone(orphan.pid)
    assert "ghost" not in status
    check_converged(reconcile)
    reconcile.down()


def test_3_sigkill_at_any_instant_then_the_next_pass_converges(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0,nvidia:1"
    for round_, delay in enumerate((0.35, 0.8)):
        for i, name in enumerate(("a", "b", "c")):  # a new spec each round: replaces to do
            reconcile.write(
                name,
                basePort=reconcile.port + 4 * i,
                devices={"count": i % 2},
                args=["--model", f"v{round_}"],
            )
        victim = reconcile.popen("--once")
        time.sleep(delay)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        reconcile.converge()
        check_converged(reconcile)
        status = reconcile.status()
        assert set(status) == {"a", "b", "c"}
        for name, item in status.items():
            engines = {p for p in reconcile.pids(name) if os.getpgid(p) == p}
            assert engines == {item["pid"]}, (name, engines, item)
            assert reconcile.record(name)["stored_spec"]["args"] == ["--model", f"v{round_}"]
    reconcile.down()


# -- 4 ---------------------------------------------------------------------------------------


def test_4_a_manifest_that_fails_to_load_tears_nothing_down(reconcile: Any) -> None:
    path = reconcile.write("web")
    reconcile.converge()
    pid = reconcile.status()["web"]["pid"]
    good = path.read_text()
    path.write_text(good + "  port: [\n")
    result = reconcile.once(check=1)
    assert f"{path}:" in result.err
    web = reconcile.status()["web"]
    assert web["pid"] == pid and alive(pid) and web["phase"] == "Ready"
    assert web["spec_valid"] is False
    assert web["message"].startswith(f"spec invalid (engine left running): {path}:")
    assert "invalid YAML" in web["message"]
    assert "(spec invalid)" in reconcile("status", check=0).out
    path.write_text(good)
    reconcile.once()
    web = reconcile.status()["web"]
    assert web["spec_valid"] is True and web["message"] == "" and web["pid"] == pid

    # broken again, and now its engine dies: status must not claim it runs
    path.write_text(good + "  port: [\n")
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    reconcile.once(check=1)
    web = reconcile.status()["web"]
    assert web["phase"] == "BackOff" and web["ready"] is False and web["spec_valid"] is False
    assert web["message"].startswith("spec invalid (engine not running):")
    assert reconcile.pids("web") == set()  # no restart from a spec that does not load
    path.write_text(good)
    reconcile.converge()
    web = reconcile.status()["web"]
    assert web["phase"] == "Ready" and web["spec_valid"] is True and web["pid"] != pid
    reconcile.down()


def test_4_an_engine_starting_when_its_manifest_broke_becomes_ready(reconcile: Any) -> None:
    """A commit with a typo pushed while the engine of the one before loaded: the engine
    was left running but never probed again, `Starting` for good (0/1, no traffic through
    the gateway) until the manifest was fixed."""
    path = reconcile.write("web", command=reconcile.demo_command(load_seconds="10"))
    reconcile.once()
    web = reconcile.status()["web"]
    assert web["phase"] == "Starting", web  # still loading its weights
    pid, good = web["pid"], path.read_text()
    path.write_text(good + "  port: [\n")
    wait_for(lambda: _answers(web["port"]), timeout=60, what="the engine answers /health")
    reconcile.once(check=1)
    web = reconcile.status()["web"]
    assert web["phase"] == "Ready" and web["ready"] is True and web["pid"] == pid, web
    assert web["spec_valid"] is False, web
    assert web["message"].startswith(f"spec invalid (engine left running): {path}:"), web
    path.write_text(good)
    reconcile.once()
    web = reconcile.status()["web"]
    assert web["phase"] == "Ready" and web["spec_valid"] is True and web["pid"] == pid, web
    reconcile.down()


def _answers(port: int) -> bool:
    """The demo engine's /health answers 200 (it has loaded)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as got:
            return bool(got.status == 200)
    except OSError:
        return False


def test_4_an_emptied_manifest_file_tears_nothing_down(reconcile: Any) -> None:
    """A file cut to nothing (an editor's save on a full disk, a truncating write seen
    halfway) once stopped the engine it declared while another manifest kept the folder
    prune-safe; a file of only comments is a choice, and still removes it."""
    path = reconcile.write("web")
    reconcile.write("other", basePort=reconcile.port + 5)
    reconcile.converge()
    pid = reconcile.status()["web"]["pid"]
    good = path.read_text()
    path.write_text("")
    result = reconcile.once(check=1)
    assert f"{path}: the file is empty" in result.err, result.err
    web = reconcile.status()["web"]
    assert web["pid"] == pid and alive(pid) and web["spec_valid"] is False
    assert "delete the file" in web["message"], web["message"]
    path.write_text(good)
    reconcile.once()
    assert reconcile.status()["web"]["pid"] == pid
    path.write_text("# web is off for now\n")
    reconcile.once()
    assert "web" not in reconcile.status()
    wait_gone(pid)
    reconcile.down()


def test_4_a_manifest_moved_to_another_file_then_broken_there_tears_nothing_down(
    reconcile: Any,
) -> None:
    """A manifest moved into another file (renamed, or merged into a multi-document one)
    once left its record naming the old file: a typo in the new file then stopped the
    engine as 'manifest removed', since only the old file counted as its broken source."""
    web = reconcile.write("web")
    other = reconcile.write("other", basePort=reconcile.port + 5)
    reconcile.converge()
    pid = reconcile.status()["web"]["pid"]
    merged = other.read_text() + "---\n" + web.read_text()
    other.write_text(merged)
    web.unlink()
    reconcile.once()
    item = reconcile.status()["web"]
    assert item["pid"] == pid and item["source"] == str(other), item
    other.write_text(merged + "  port: [\n")
    reconcile.once(check=1)
    item = reconcile.status()["web"]
    assert item["pid"] == pid and alive(pid) and item["spec_valid"] is False, item
    assert item["message"].startswith(f"spec invalid (engine left running): {other}:"), item
    reconcile.down()


# -- 5 ---------------------------------------------------------------------------------------


def test_5_a_missing_or_empty_folder_prunes_nothing(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()
    pid = reconcile.status()["web"]["pid"]
    moved = reconcile.tmp / "unmounted"
    reconcile.manifests.rename(moved)
    result = reconcile.once(check=None)
    assert f"manifests folder {reconcile.manifests} does not exist: nothing pruned" in result.err
    reconcile.manifests.mkdir()  # a half-done checkout: the folder, no manifests
    (reconcile.manifests / "web.yaml").write_text("")
    result = reconcile.once(check=None)
    assert "nothing pruned" in result.err, result.err
    assert reconcile.status()["web"]["pid"] == pid and alive(pid)
    reconcile.once("--allow-empty")
    assert reconcile.status() == {}
    wait_gone(pid)
    reconcile.down()


# -- 6 ---------------------------------------------------------------------------------------


def test_6_pid_reuse_never_makes_a_dead_engine_look_alive(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()
    web = reconcile.status()["web"]
    reuser = reconcile.spawn([sys.executable, "-c", "import time; time.sleep(300)"])
    os.kill(web["pid"], signal.SIGKILL)
    wait_gone(web["pid"])
    store = reconcile.store()
    rec = store.read("web")
    real = identity(reuser.pid)
    assert real is not None
    # the dead engine's pid, now a live process that started later
    store.write(replace(rec, ref=ProcessRef(pid=reuser.pid, start_time=real.start_time - 60)))
    reconcile.converge()
    again = reconcile.status()["web"]
    assert again["restarts"] == 1 and again["pid"] != reuser.pid
    assert reuser.poll() is None  # never signalled
    reconcile.down()


# -- 7 ---------------------------------------------------------------------------------------


def test_7_a_dead_lock_holder_blocks_nobody(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.store()
    lock = reconcile.state / "placement.lock"
    holder = reconcile.spawn(
        [sys.executable, "-c",
         "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid());"
         "print('held', flush=True); time.sleep(300)", str(lock)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdout.readline() == b"held\n"
    holder.stdout.close()
    busy = reconcile.once("--lock-timeout", "0.5s", check=1)
    assert f"placement lock ({lock}) is held by pid {holder.pid}" in busy.err
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    reconcile.once()  # the kernel released it with its holder
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")
    reconcile.down()


def test_7_no_lock_held_across_a_grace_period_or_a_readiness_wait(reconcile: Any) -> None:
    lock = FileLock(reconcile.state / "placement.lock")
    reconcile.write("slow", command=reconcile.demo_command(load_seconds="1.5"))
    waiting = reconcile.popen("--once", "--wait", "--timeout", "30s")
    wait_for(lambda: (reconcile.record("slow") or {}).get("phase") == "Starting", what="Starting")
    assert lock.try_acquire(), "the placement lock is held during a readiness wait"
    lock.release()
    assert waiting.wait(timeout=60) == 0

    reconcile.write("stubborn", command=[sys.executable, "-c", IGNORE_TERM, "{port}"],
                    stopGracePeriodSeconds=1.5)  # fmt: skip
    reconcile.converge()
    (reconcile.manifests / "stubborn.yaml").unlink()
    stopping = reconcile.popen("--once")
    wait_for(lambda: (reconcile.record("stubborn") or {}).get("phase") == "Terminating",
             what="Terminating")  # fmt: skip
    assert lock.try_acquire(), "the placement lock is held during a grace period"
    lock.release()
    assert stopping.wait(timeout=60) == 0
    assert reconcile.record("stubborn") is None and reconcile.pids("stubborn") == set()
    reconcile.down()


# -- 8 ---------------------------------------------------------------------------------------


def test_8_a_pass_prunes_only_what_it_owns(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0,nvidia:1"
    team_a, team_b = reconcile.manifests, reconcile.tmp / "team-b"
    reconcile.write("a1", devices={"count": 1})
    reconcile.write("b1", folder=team_b, devices={"count": 1}, basePort=reconcile.port + 5)
    reconcile.once("-f", str(team_a))
    reconcile.once("-f", str(team_b))
    status = reconcile.status()
    assert {status["a1"]["devices"][0], status["b1"]["devices"][0]} == {"nvidia:0", "nvidia:1"}
    assert status["a1"]["owner"] != status["b1"]["owner"]
    b_pid = status["b1"]["pid"]

    reconcile.write("a1", folder=team_b, basePort=reconcile.port + 10)  # B claims A's name
    conflict = reconcile.once("-f", str(team_b), check=1)
    assert "is owned by another manifest set" in conflict.err + conflict.out
    said = f"pass `--owner {status['a1']['owner']!r}`"  # the fix, not a rename (issue 34, 23)
    assert said in conflict.err + conflict.out, conflict
    (team_b / "a1.yaml").unlink()
    assert reconcile.status()["a1"]["pid"] == status["a1"]["pid"]

    (team_a / "a1.yaml").unlink()
    reconcile.once("-f", str(team_a), "--allow-empty")  # A's set is empty: prune all of A's
    after = reconcile.status()
    assert set(after) == {"b1"} and after["b1"]["pid"] == b_pid and alive(b_pid)
    reconcile.down("-f", str(team_a))
    assert set(reconcile.status()) == {"b1"}
    reconcile.down("-f", str(team_b))


# -- 9 ---------------------------------------------------------------------------------------


def test_9_no_user_supplied_name_reaches_outside_the_state_dir(reconcile: Any) -> None:
    doc = reconcile.deployment("x")
    doc["metadata"]["name"] = "../../escaped"
    reconcile.write_text("evil.yaml", reconcile.dump_yaml(doc))
    reconcile.once(check=1)
    for verb in ("logs", "describe"):
        result = reconcile(verb, "../../etc/passwd", check=1)
        assert "no deployment named '../../etc/passwd'" in result.err, result  # never a path
        assert "root:" not in result.out, result
    store = reconcile.store()
    crafted = {"version": 1, "name": "../../escaped", "owner": "o", "node": reconcile.node}
    (store.instances / "crafted.json").write_text(json.dumps(crafted))
    reconcile.once(check=1)
    assert not (store.instances / "crafted.json").exists()  # quarantined, never followed
    assert sorted(p.name for p in reconcile.tmp.iterdir()) == ["manifests", "state"]
    assert not list(reconcile.tmp.parent.glob("escaped*"))
    reconcile.down()


# -- 10 --------------------------------------------------------------------------------------


def test_10_no_shell_and_teardown_reaches_the_whole_group(reconcile: Any) -> None:
    tricky = ["$(touch pwned)", "; touch pwned2 #", "`touch pwned3`", "|", "&&"]
    reconcile.write(
        "literal",
        command=[sys.executable, "-c", "import time; time.sleep(300)", *tricky],
        readiness=None,
        basePort=reconcile.port + 5,
    )
    reconcile.write("family", command=[sys.executable, "-c", WITH_CHILD, "{port}"],
                    stopGracePeriodSeconds=0.5)  # fmt: skip
    reconcile.converge()
    status = reconcile.status()
    argv = Path(f"/proc/{status['literal']['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in argv[-len(tricky):]] == tricky  # fmt: skip
    assert not list(reconcile.tmp.rglob("pwned*"))
    family = reconcile.pids("family")
    assert len(family) == 2  # the engine and its TERM-ignoring child, one group
    assert {os.getpgid(p) for p in family} == {status["family"]["pid"]}
    reconcile.down()
    for pid in family:
        assert not alive(pid)


# -- 11 --------------------------------------------------------------------------------------


def test_11_bad_input_gets_a_clear_error_and_disturbs_nothing(reconcile: Any) -> None:
    path = reconcile.write("running")
    reconcile.converge()
    pid = reconcile.status()["running"]["pid"]
    m = reconcile.manifests
    reconcile.write_text("malformed.yaml", "apiVersion: reconcile/v1\nkind: [Deployment\n")
    typed = reconcile.deployment("typed", devices={"count": "two"})
    reconcile.write_text("typed.yaml", reconcile.dump_yaml(typed))
    unknown = reconcile.deployment("unknown", replica=3)
    reconcile.write_text("unknown.yaml", reconcile.dump_yaml(unknown))
    reconcile.write("dup", basePort=reconcile.port + 5)
    reconcile.write_text("dup2.yaml", (m / "dup.yaml").read_text())
    (m / "unreadable.yaml").mkdir()
    reconcile.write("fine", basePort=reconcile.port + 7)
    # the running engine's own manifest breaks: a wrong type in its spec
    path.write_text(
        path.read_text().replace("stopGracePeriodSeconds: 2", "stopGracePeriodSeconds: soon")
    )

    result = reconcile("validate", check=1)
    errors = result.err
    assert f"{m / 'malformed.yaml'}:3: invalid YAML" in errors
    assert (
        f"{m / 'typed.yaml'}:" in errors
        and "spec.devices.count: Input should be a valid integer" in errors
    )
    assert "spec.replica: unknown field" in errors
    assert f"{m / 'dup.yaml'}:4: metadata.name: duplicate deployment name 'dup'" in errors
    assert f"{m / 'dup2.yaml'}:4: metadata.name: duplicate" in errors
    assert f"{m / 'unreadable.yaml'}: cannot read: a folder, not a file" in errors
    assert "spec.stopGracePeriodSeconds" in errors

    reconcile.once(check=1)
    status = reconcile.status()
    assert status["fine"]["phase"] in ("Starting", "Ready")  # nothing else is disturbed
    for name in ("dup", "typed"):  # seen, so recorded: Pending, spec invalid, no engine
        assert status[name]["phase"] == "Pending" and status[name]["pid"] is None
        assert status[name]["spec_valid"] is False
        assert status[name]["message"].startswith("spec invalid (not started): ")
    running = status["running"]
    assert running["pid"] == pid and alive(pid) and running["spec_valid"] is False
    assert f"{path}:" in running["message"] and "spec.stopGracePeriodSeconds" in running["message"]
    reconcile.down()
