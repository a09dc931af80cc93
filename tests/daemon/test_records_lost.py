"""A record lost under a running daemon: quarantined (torn) or deleted by hand.

A torn record's engine is adopted again by its marker (it keeps its pid, devices and
port); a hand-deleted record's engine is reaped, and the daemon collects its child. The
whole state dir gone (its disk unmounted) is no record deleted: nothing is reaped.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

from procs import GATEWAY_MARKER, marked_pids

from controller.host.procs import identity
from tests.daemon.test_daemon_loop import proc_state, ready_pid
from tests.integration.test_invariants import reservation


def test_a_torn_record_keeps_its_engine(reconcile: Any, daemon: Any, finish: Any) -> None:
    rc = reconcile
    rc.write("web", devices={"count": 1})
    d = daemon(resync="0.3s")  # passes come by themselves: a torn record is no event
    pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
    before = rc.record("web")
    rc.record_path("web").write_text(rc.record_path("web").read_text()[:40])
    d.wait(lambda: d.lines("records unreadable"), "the quarantine's warning")
    after = d.wait(lambda: ready_pid(rc, "web") and rc.record("web"), "web Ready again")
    assert after["ref"]["pid"] == pid and after["nonce"] == before["nonce"], after
    assert (after["devices"], after["port"]) == (before["devices"], before["port"])
    assert rc.pids("web") == {pid}, "no second engine, nothing killed"
    with urllib.request.urlopen(f"http://127.0.0.1:{after['port']}/health", timeout=10) as r:
        assert r.status == 200
    (warning,) = d.lines("records unreadable")
    assert warning["level"] == "warning" and "not valid JSON" in warning["problems"]
    adopted = d.lines("engine of a quarantined record adopted")
    assert adopted and adopted[0]["level"] == "warning" and adopted[0]["pid"] == pid
    assert [e["action"] for e in rc.events("web")].count("adopt") == 1
    finish(d)


def test_a_reaped_orphan_is_no_zombie(reconcile: Any, daemon: Any, finish: Any) -> None:
    rc = reconcile
    rc.write("web")
    d = daemon(resync="0.3s")
    first = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
    rc.record_path("web").unlink()  # by hand: no quarantine, so its engine is an orphan
    d.wait(lambda: (ready_pid(rc, "web") or first) != first, "a new engine")
    d.wait(lambda: proc_state(first) is None, "the reaped engine collected by its parent")
    reap = [e for e in rc.events("web") if e["action"] == "reap"]
    assert reap and str(first) in reap[0]["outcome"], reap
    finish(d)


def test_a_state_dir_gone_under_the_daemon_stops_no_engine_until_it_is_back(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """The state dir moved away (its disk unmounted, then mounted again): a pass made it
    afresh, found no record, and stopped the healthy engine as one no record accounts for,
    then started another. Passes wait for it now, saying why, and resume once it is back."""
    rc = reconcile
    rc.write("web", devices={"count": 1})
    d = daemon()  # no resync: passes come only when asked, none under the move
    pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
    d.wait(lambda: any("ready" in p["actions"] for p in d.passes()), "that pass's end")
    away = rc.tmp / "unmounted"
    rc.state.rename(away)
    os.kill(d.pid, signal.SIGUSR1)  # a pass, now
    (refused,) = d.wait(lambda: d.lines("pass refused"), "the pass refused")
    assert f"the state dir {rc.state} was removed or replaced" in refused["reason"], refused
    assert refused["next"].startswith("the engines run on, untouched: put the state dir back")
    assert not rc.state.exists()  # nothing made afresh there
    away.rename(rc.state)
    os.kill(d.pid, signal.SIGUSR1)
    d.wait(lambda: d.lines("passes go through again"), "passes resumed")
    d.wait_pass(trigger="SIGUSR1")
    assert rc.pids("web") == {pid} and ready_pid(rc, "web") == pid, "web untouched"
    assert "reap" not in [e["action"] for e in rc.events("web")]
    finish(d)


def _mount_again(away: Path, state: Path) -> None:
    """``away`` back at ``state`` in one step, as a disk mounted again over its mount
    point (renameat2's RENAME_EXCHANGE): a process writing by path into the folder there
    (a gateway's metrics, every half second) never finds none, nor refills it meanwhile."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, bytes(away), at_fdcwd, bytes(state), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(away))


def test_a_daemon_started_on_an_emptied_state_dir_stops_no_engine_and_resumes_once_it_is_back(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A daemon restarted while the state dir's disk was not mounted (its mount point's
    empty folder at the path) found no record and stopped every engine of the path as one
    no record accounts for. Its passes are refused now (said once, at each resync again
    in -v's debug lines), and once the state dir is back it takes that one's lock and its
    pass keeps the engine."""
    rc = reconcile
    rc.write("web", devices={"count": 1})
    rc.converge()
    pid = ready_pid(rc, "web")
    away = rc.tmp / "unmounted"
    rc.state.rename(away)
    rc.state.mkdir()
    d = daemon(resync="0.3s")
    d.wait(lambda: len(d.lines("pass refused")) >= 3, "three passes refused")
    refused, *again = d.lines("pass refused")
    assert refused["level"] == "error" and {a["level"] for a in again} == {"debug"}, again
    assert f"state dir {rc.state} is not the one its engines" in refused["reason"], refused
    assert f"(web pid {pid})" in refused["reason"], refused
    assert rc.pids("web") == {pid} and rc.record("web") is None, "nothing done"
    _mount_again(away, rc.state)
    d.wait(lambda: d.lines("passes go through again"), "passes resumed")
    d.wait(lambda: d.passes(), "a pass")
    assert ready_pid(rc, "web") == pid and rc.pids("web") == {pid}, "web kept"
    assert "reap" not in [e["action"] for e in rc.events("web")]
    assert len(d.lines("the state dir was replaced while passes were refused: its lock taken")) == 1
    assert json.loads((rc.state / "daemon.json").read_text())["pid"] == d.pid, "noted there"
    finish(d)


def _answers(port: int, model: str) -> str:
    """The engine that answered a chat request through the gateway on ``port``."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        answered: str = json.loads(r.read())["system_fingerprint"]
    return answered


def test_a_daemon_with_a_gateway_started_on_an_emptied_state_dir_leaves_the_gateway_serving(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """Its gateway, started on the emptied folder, asked the engines' gateway (which no
    file of that folder names) to stop, and answered each request `model_not_found`
    while the engines ran on; the engines' gateway, left alone, read the emptied folder's
    records (none) and answered the same. It starts no gateway while passes are refused,
    and a gateway keeps its last reading while the folder at the path is another state
    dir's with no record: the engines' serves on, and is adopted once their dir is back."""
    rc = reconcile
    rc.write("web", devices={"count": 1})
    listen = ["--listen", str(rc.port + 15)]
    first = daemon(*listen, resync="0.3s")
    pid = first.wait(lambda: ready_pid(rc, "web"), "web Ready")
    (gateway,) = first.wait(lambda: marked_pids(f"{rc.node}/", GATEWAY_MARKER), "the gateway")
    assert first.stop() == 0  # the gateway serves on, as a daemon's restart leaves it
    away = rc.tmp / "unmounted"
    rc.state.rename(away)
    rc.state.mkdir()
    d = daemon(*listen, resync="0.3s")
    d.wait(lambda: d.lines("pass refused"), "the pass refused")
    (held,) = d.lines("gateway not started")
    assert held["level"] == "warning", held
    assert _answers(rc.port + 15, "web") == f"pid-{pid}", "the engines' gateway serves on"
    assert marked_pids(f"{rc.node}/", GATEWAY_MARKER) == {gateway}
    _mount_again(away, rc.state)
    d.wait(lambda: d.lines("passes go through again"), "passes resumed")
    (adopted,) = d.wait(lambda: d.lines("gateway adopted"), "the gateway adopted")
    assert adopted["pid"] == gateway, adopted
    assert _answers(rc.port + 15, "web") == f"pid-{pid}" and ready_pid(rc, "web") == pid
    finish(d)


def test_a_gateway_started_on_a_replaced_state_dir_leaves_the_old_dir_s_gateway_serving(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A gateway started on the folder at the path once the state dir's disk was unmounted
    (no engine of the old dir there for a pass to refuse beside) matched the old dir's
    gateway by the path its command line names: it bound beside it and asked it to stop.
    A gateway carries its state dir's id: the old one is another state dir's, so the new
    one does not bind beside it (the daemon exits 1, as for any port another holds), names
    it and leaves it serving."""
    rc = reconcile
    port = rc.port + 15
    first = daemon("--listen", str(port), resync="0.3s")
    (gateway,) = first.wait(lambda: marked_pids(f"{rc.node}/", GATEWAY_MARKER), "the gateway")
    assert rc.environ(gateway)["RECONCILE_STATE_ID"] == (rc.state / "id").read_text().strip()
    assert first.stop() == 0  # the gateway serves on, as a daemon's restart leaves it
    away = rc.tmp / "unmounted"
    rc.state.rename(away)
    rc.state.mkdir()
    d = daemon("--listen", str(port), resync="0.3s")
    assert d.proc.wait(timeout=60) == 1, d.tail()  # as for any port another holds
    said = f"another state dir once at {rc.state.resolve()} (pid {gateway}; its disk not"
    assert said in d.log.read_text() and STOPPED not in d.log.read_text(), d.tail()
    assert marked_pids(f"{rc.node}/", GATEWAY_MARKER) == {gateway}, "the old one serves on"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
        assert answer.status == 200
    _mount_again(away, rc.state)
    again = daemon("--listen", str(port), resync="0.3s")
    (adopted,) = again.wait(lambda: again.lines("gateway adopted"), "the gateway adopted")
    assert adopted["pid"] == gateway, adopted
    finish(again)


STOPPED = "gateway of this state dir that no file names asked to stop"


def test_a_pass_that_failed_after_a_spawn_leaves_no_reservation_for_the_daemon_s_life(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A pass that failed between an engine's spawn and its record's write (ENOSPC: the
    state dir's disk full) left the record Reserved, with no pid, for the daemon's whole
    life: its maker, the daemon, lived on, and a live maker's reservation is left alone.
    Its next pass adopts the engine by its marker: one engine, Ready. The failure's line
    says the next move, and the pass that goes through again says so."""
    rc = reconcile
    rc.write("web", devices={"count": 1})
    armed = {"RECONCILE_FAILPOINTS": "executor.spawn.before_record=enospc"}
    d = daemon(resync="0.3s", env=armed)  # passes come by themselves after the failure
    failed = d.wait(lambda: d.lines("pass failed"), "the pass that failed after the spawn")
    assert "No space left on device" in failed[0]["error"], failed
    assert failed[0]["next"].startswith("free space on (or fix the permissions of)"), failed
    pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready (its engine adopted)")
    d.wait(lambda: d.lines("passes go through again"), "the failure's end said")
    assert rc.pids("web") == {pid}, "one engine: the spawned one, never a second"
    assert rc.record("web")["devices"] == ["nvidia:0"]
    (adopt,) = [e for e in rc.events("web") if e["action"] == "adopt"]
    assert f"its maker (pid {d.pid}) left it in a pass that failed" in adopt["reason"], adopt
    finish(d)


def _torn_under_its_engine(rc: Any) -> dict[str, Any]:
    """``web`` Ready on one device, then its record torn (``{``): the record it had."""
    rc.write("web", devices={"count": 1})
    rc.converge()
    before: dict[str, Any] = rc.record("web")
    rc.record_path("web").write_text("{")
    return before


def test_a_record_torn_between_passes_is_rebuilt_by_the_next(reconcile: Any) -> None:
    """No daemon: `status` names the torn record and leaves it; the next cron pass
    quarantines it and adopts its engine."""
    rc = reconcile
    before = _torn_under_its_engine(rc)
    assert "not valid JSON" in rc("status", check=1).err  # named, never moved by a read
    assert rc.record_path("web").read_text() == "{"
    _set_aside_and_adopted(rc, before)


def test_a_folder_in_a_records_place_is_set_aside_as_a_torn_record_is(reconcile: Any) -> None:
    """A record that cannot even be opened (a folder by hand; EIO alike) made `status` fail
    whole (`I/O error`, no table), the page answer 500 and every pass fail, the other
    deployments unreconciled: it is named where it lies, then quarantined, its engine
    adopted, as a torn record's."""
    rc = reconcile
    rc.write("api")
    before = _torn_under_its_engine(rc)
    path = rc.record_path("web")
    path.unlink()
    path.mkdir()
    table = rc("status", check=1)  # named, never moved by a read; the others still shown
    assert f"record {path} cannot be read (unreadable: Is a directory)" in table.err, table
    assert "\napi " in table.out and path.is_dir(), table
    _set_aside_and_adopted(rc, before)


def _set_aside_and_adopted(rc: Any, before: dict[str, Any]) -> None:
    """The pass sets web's record aside, named, and takes its engine up as it was."""
    assert "record moved to" in rc.once(check=1).err
    rc.converge()
    after = rc.record("web")
    assert after["ref"] == before["ref"] and after["devices"] == before["devices"], after
    assert rc.pids("web") == {before["ref"]["pid"]}
    rc.down()


def test_a_file_in_the_place_of_the_logs_folder_is_named_with_the_move(reconcile: Any) -> None:
    """Every pass failed on it with `I/O error: .../instances/logs: File exists.`"""
    rc = reconcile
    rc.write("web")
    rc.converge()
    pid = rc.record("web")["ref"]["pid"]
    logs = rc.state / "instances" / "logs"
    logs.rename(rc.tmp / "logs-aside")
    logs.write_text("")
    refused = rc.once(check=1)
    assert f"reconcile: {logs} is not a folder: reconcile keeps its logs files there" in (
        refused.err
    ), refused
    assert "Move it away" in refused.err and rc.pids("web") == {pid}, refused
    logs.unlink()
    rc.once()
    assert rc.pids("web") == {pid}
    rc.down()


def test_the_daemon_names_a_folder_in_a_files_place_and_the_move(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """Its `pass failed` said `free space on (or fix the permissions of) the disk`, naming
    the writer's tmp file: the move is to take the folder away, and the file is named."""
    rc = reconcile
    rc.write("web")
    d = daemon(resync="0.3s")
    pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
    observed = rc.state / "observed.json"
    observed.unlink(missing_ok=True)
    observed.mkdir()
    (observed / "x").write_text("x")
    rc.write("api")  # a pass that has something new to note in observed.json
    (failed, *_) = d.wait(lambda: d.lines("pass failed"), "the pass failed, said")
    assert failed["error"] == f"[Errno 21] Is a directory: '{observed}'", failed
    assert failed["next"].startswith("a folder stands where reconcile keeps a file"), failed
    assert rc.pids("web") == {pid}
    shutil.rmtree(observed)
    d.wait(lambda: ready_pid(rc, "api"), "api Ready once it is gone")
    finish(d)


def test_a_torn_records_engine_never_double_books_its_device(reconcile: Any) -> None:
    rc = reconcile
    rc.devices = "nvidia:0"
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    rc.write("other", basePort=rc.port + 5, devices={"count": 1})
    me = identity(os.getpid())  # a live maker: its reservation is left alone
    held = reservation(rc, "other", nonce="n-other", port=rc.port + 5, devices=("nvidia:0",))
    rc.store().write(dataclasses.replace(held, reserved_by=me))
    plan = rc("plan", "-o", "json", check=1)  # no adoption shown: the pass reaps it
    assert ("reap", "web") in [(c["action"], c["name"]) for c in plan.json()["changes"]], plan
    result = rc.once(check=None)
    assert "its device nvidia:0 is held by other" in result.err, result.err
    rc.wait_gone(pid)  # ours (its marker) and holding what another record holds: reaped
    assert rc.record("web")["phase"] == "Pending" and not rc.record("web")["devices"]
    rc.record_path("other").unlink()  # the test is its maker: it lets go
    rc.down()


def test_down_stops_the_engine_of_a_torn_record(reconcile: Any) -> None:
    """`down` once said "nothing to stop" (exit 0) of a set whose only record was torn,
    and left its engine running with no record: its devices looked free to every pass."""
    rc = reconcile
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    out = rc.down()
    assert "stopped web" in out.out, (out.out, out.err)
    rc.wait_gone(pid)
    assert not rc.pids("web") and not rc.record_path("web").exists()


def test_down_stops_the_engine_of_a_torn_record_whose_manifest_went(reconcile: Any) -> None:
    """Its marker names this set, so `down` stops it though nothing declares it to
    adopt: once left running, its device and port looking free to every pass."""
    rc = reconcile
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    rc.write("keep", basePort=rc.port + 5)
    (rc.manifests / "web.yaml").unlink()
    out = rc.down()
    assert "stopped web" in out.out and "stopped keep" not in out.out, (out.out, out.err)
    rc.wait_gone(pid)
    assert not rc.pids()


def test_another_sets_pass_spares_a_torn_records_engine_and_its_device(reconcile: Any) -> None:
    """Sets share the records (invariant 8) but a marker names no owner: another set's
    pass once reaped the engine of a torn record as an orphan (SIGKILL) and placed its
    own engine on the freed device. It is left running now, its device and port held,
    and its own set's next pass adopts it."""
    rc = reconcile
    rc.devices = "nvidia:0"
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    other = rc.tmp / "other"
    other.mkdir()
    rc.write("batch", folder=other, basePort=rc.port + 5, devices={"count": 1})
    result = rc("-f", str(other), "--once", check=1)
    assert rc.alive(pid), result.err
    batch = rc.record("batch")
    assert batch["phase"] == "Pending" and not batch["devices"], batch
    assert "web" in batch["message"], batch["message"]
    rc.converge()  # web's own set: adopted by its marker, same pid
    assert rc.record("web")["ref"]["pid"] == pid
    rc.down()
    rc.down("-f", str(other))


def test_a_torn_records_engine_whose_manifest_went_is_reaped_by_its_own_set(
    reconcile: Any,
) -> None:
    """The marker once named no set: a pass took the engine of its own torn record, whose
    manifest was deleted meanwhile, for another set's, and left it running with its device
    and port held, forever. The marker names the set now: its own pass reaps it."""
    rc = reconcile
    rc.devices = "nvidia:0"
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    rc.write("keep", basePort=rc.port + 5)  # the folder is not emptied: it may prune
    (rc.manifests / "web.yaml").unlink()
    result = rc.once(check=None)
    rc.wait_gone(pid)
    reap = [e for e in rc.events("web") if e["action"] == "reap"]
    assert reap and str(pid) in reap[0]["outcome"], (reap, result.err)
    rc.write("web2", devices={"count": 1}, basePort=rc.port + 10)
    rc.converge()  # the device it held is free again
    assert rc.record("web2")["devices"] == ["nvidia:0"]
    rc.down()


def test_a_set_declaring_the_same_name_spares_another_sets_torn_engine(reconcile: Any) -> None:
    """Once adopted by the wrong set (a record of its spec over another set's engine): the
    other set's pass leaves it running, says the name is held, and starts no namesake."""
    rc = reconcile
    rc.devices = "nvidia:0"
    before = _torn_under_its_engine(rc)
    pid = before["ref"]["pid"]
    other = rc.tmp / "other"
    other.mkdir()
    rc.write("web", folder=other, basePort=rc.port + 5)
    plan = rc("plan", "-f", str(other), "-o", "json", check=1)  # what the pass will do
    assert [c["action"] for c in plan.json()["changes"]] == ["conflict"], plan.out
    result = rc("-f", str(other), "--once", check=1)
    assert "held by another manifest set's engine" in result.err, result.err
    assert rc.alive(pid) and rc.record("web") is None and rc.pids("web") == {pid}
    rc.converge()  # its own set adopts it: same engine, its owner
    after = rc.record("web")
    assert (after["ref"]["pid"], after["owner"]) == (pid, before["owner"]), after
    assert "owned by another manifest set" in rc("-f", str(other), "--once", check=1).err
    rc.down()


def test_an_older_versions_engine_keeps_the_guess_by_name(reconcile: Any) -> None:
    """An engine started before markers named their set: another set's pass spares it
    where it does not declare its name (its device held), and the set declaring it adopts
    it, as before."""
    rc = reconcile
    rc.devices = "nvidia:0"
    rc.write("web", devices={"count": 1})
    port = rc.port
    env = {**rc.env, "PORT": str(port), "CUDA_VISIBLE_DEVICES": "0",
           "RECONCILE_INSTANCE": f"{rc.node}/web/old1",
           "RECONCILE_STATE": str(rc.state.resolve())}  # fmt: skip
    argv = [*rc.demo_command()[:3], "--port", str(port)]
    rc.spawn(argv, env=env, start_new_session=True)
    rc.wait_for(lambda: not rc.bindable(port), what="the old engine to listen")
    pid = next(iter(rc.pids("web")))
    rc.store()  # the state dir, then a record torn after the engine started
    rc.record_path("web").write_text("{")
    other = rc.tmp / "other"
    other.mkdir()
    rc.write("batch", folder=other, basePort=rc.port + 5, devices={"count": 1})
    rc("-f", str(other), "--once", check=1)
    assert rc.alive(pid) and "another set's?" in rc.record("batch")["message"]
    rc.converge()
    assert rc.record("web")["ref"]["pid"] == pid
    rc.down()
    rc.down("-f", str(other))


def test_plan_shows_the_adoption_of_its_own_torn_records_engine(reconcile: Any) -> None:
    """`plan` once said "destroy web: engine processes (...) have no record" (and a new
    deployment beside it) where the pass adopts the engine: it shows the adoption now."""
    rc = reconcile
    before = _torn_under_its_engine(rc)
    pid = before["ref"]["pid"]
    plan = rc("plan", "-o", "json", check=1)  # 1: the torn record is an error, as for --once
    changes = [(c["action"], c["name"]) for c in plan.json()["changes"]]
    assert changes == [("adopt", "web")], plan.out
    assert f"pid {pid}" in plan.json()["changes"][0]["reason"], plan.out
    text = rc("plan", check=1).out
    assert "have no record" not in text and "adopt" in text, text
    assert rc.record_path("web").read_text() == "{"  # plan moved nothing
    rc.once(check=1)  # what plan showed: the engine adopted, no other started
    assert rc.record("web")["ref"] == before["ref"] and rc.pids("web") == {pid}
    assert [e["action"] for e in rc.events("web")].count("adopt") == 1
    rc.down()


def test_wait_over_a_torn_record_ends_ready_saying_its_engine_was_adopted(
    reconcile: Any,
) -> None:
    """`--once --wait` once ended "cannot progress without you: record moved to ..." (exit
    1) though the pass had adopted the engine and it was Ready: nothing was left to do.
    It ends Ready now, saying what became of the record and of its engine."""
    rc = reconcile
    pid = _torn_under_its_engine(rc)["ref"]["pid"]
    waited = rc("--once", "--wait", "--timeout", "60s", check=0)
    assert "cannot progress" not in waited.err, waited.err
    said = [line for line in waited.err.splitlines() if "record moved to" in line]
    assert len(said) == 1 and "not valid JSON" in said[0], waited.err
    assert f"its engine (pid {pid}) adopted, as its marker names it" in said[0], said
    assert rc.record("web")["phase"] == "Ready" and rc.pids("web") == {pid}
    rc.down()


def test_devices_shows_a_torn_records_engine_holding_its_device(reconcile: Any) -> None:
    """`devices` once showed a torn record's device free until a pass adopted its engine:
    its engine's marker and environment say what it holds, as the pass tells it."""
    rc = reconcile
    before = _torn_under_its_engine(rc)
    (device,) = before["devices"]
    shown = rc("devices", "-o", "json", check=1)  # 1: a record could not be read
    doc = shown.json()
    holder = f"web (torn record; engine pid {before['ref']['pid']})"
    held = {d["device"]: d["held_by"] for d in doc["devices"]}
    assert held == {"nvidia:0": [], "nvidia:1": [], device: [holder]}, doc
    assert {"port": before["port"], "held_by": holder, "phase": "Unknown"} in doc["ports"], doc
    assert "not valid JSON" in shown.err, shown
    assert holder in rc("devices", check=1).out
    assert rc.record_path("web").read_text() == "{", "a read verb moves nothing"
    rc.down()


def test_devices_says_unknown_where_a_torn_records_holdings_cannot_be_told(
    reconcile: Any,
) -> None:
    """An engine whose environment does not tell its port (nor so its lease): no device is
    shown free while that torn record may name it."""
    rc = reconcile
    rc.write("web", devices={"count": 1}, command=["env", "-u", "PORT", *rc.demo_command()])
    rc.converge()
    rc.record_path("web").write_text("{")
    doc = rc("devices", "-o", "json", check=1).json()
    unknown = f"unknown (torn record {rc.record_path('web')})"
    assert [d["held_by"] for d in doc["devices"]] == [[unknown], [unknown]], doc
    assert all(d["holders"][0]["phase"] == "Unknown" for d in doc["devices"]), doc
    rc.down()
