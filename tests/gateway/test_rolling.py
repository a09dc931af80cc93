"""RollingUpdate through the gateway: a request loop runs for the whole update and
none of its requests fails; once the new instance answers, the old one never does
again. With room for one only, the update recreates and the journal says why. A
daemon SIGKILLed mid-promotion leaves records the next daemon finishes, no engine leaked.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from clients import Loop, Stream
from procs import accepts, wait_for

from controller.core.manifest.names import next_name
from controller.failpoints import ROLLING_POINTS
from controller.store.statedir import StateDir

GPU = {"count": 1, "kind": "nvidia"}
WAIT = 40.0
ECHO = Path(__file__).with_name("echo_engine.py")
# An engine that loads until a file exists (the test says when): argv[1] the file, the
# rest the engine it becomes (the same pid, so the record's process stays the engine).
GATED = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.05)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def roll(reconcile: Any, version: str) -> None:
    """The deployment; ``version`` changes its argv (so its hash): an update to roll out."""
    command = reconcile.demo_command(load_seconds="1", chunks=version)
    reconcile.write("roll", devices=GPU, strategy="RollingUpdate", command=command)


def rolled_to_a_held_next(reconcile: Any, g: Any) -> tuple[int, int, Path]:
    """``roll`` Ready, then rolled to a ``@next`` that loads until the file returned
    exists: the old engine's pid, the ``@next``'s (Starting), the file."""
    loaded = reconcile.tmp / "loaded"
    old_pid = g.wait_phase("roll", "Ready")["pid"]
    command = [sys.executable, "-c", GATED, str(loaded), *reconcile.demo_command(chunks="4")]
    # Its deadline outlasts the handover at any load: a retried `@next` is another start.
    probe = {"httpGet": {"path": "/health"}, "deadlineSeconds": 300, "periodSeconds": 0.2}
    reconcile.write("roll", devices=GPU, strategy="RollingUpdate", command=command, readiness=probe)
    nxt_pid = g.wait_phase(next_name("roll"), "Starting")["pid"]
    return old_pid, nxt_pid, loaded


def new_engine_ready(reconcile: Any, old_pid: int) -> int:
    """Wait for ``roll`` to be Ready on a new engine with no ``@next`` left; its pid."""

    def done() -> int | None:
        status = reconcile.status()
        item = status.get("roll", {})
        settled = item.get("phase") == "Ready" and "roll@next" not in status
        return item["pid"] if settled and item.get("pid") not in (None, old_pid) else None

    pid: int = reconcile.wait_for(done, timeout=WAIT, what="roll Ready on a new engine")
    return pid


def served(loop: Loop, old: str, new: str) -> None:
    """Every request answered 200; after the first from ``new``, none from ``old``."""
    assert not loop.errors, loop.errors[:5]
    bad = [a for a in loop.answers if a[0] != 200]
    assert not bad, bad[:5]
    pids = [pid for _, pid in loop.answers]
    assert old in pids and new in pids, sorted(set(pids))
    first_new = pids.index(new)
    assert old not in pids[first_new:], "the old version answered after the switch"


def test_rolling_update_fails_no_request(reconcile: Any, gateway: Any) -> None:
    roll(reconcile, "3")
    g = gateway()
    old_pid = g.wait_phase("roll", "Ready")["pid"]
    with Loop(g, "roll").running() as loop:
        loop.answered_by(reconcile, old_pid)
        roll(reconcile, "4")
        g.wait_phase("roll@next", "Starting")  # beside the old one, which still serves
        assert reconcile.alive(old_pid)
        new_pid = new_engine_ready(reconcile, old_pid)
        loop.answered_by(reconcile, new_pid)
    served(loop, f"pid-{old_pid}", f"pid-{new_pid}")
    reconcile.wait_gone(old_pid)
    assert reconcile.pids() == {new_pid}  # no old engine left, no stray `@next`
    record = reconcile.record("roll")
    assert record is not None and record["devices"] == ["nvidia:1"]  # its own device

    # The promotion's event follows its rename: the old engine can be gone just before.
    def promoted() -> bool:
        return "promote" in [e["action"] for e in reconcile.events("roll")]

    wait_for(promoted, what="the promote event")
    g.finish()


def test_no_room_for_both_recreates_and_says_so(reconcile: Any, gateway: Any) -> None:
    reconcile.devices = "nvidia:0"
    roll(reconcile, "3")
    g = gateway()
    old_pid = g.wait_phase("roll", "Ready")["pid"]
    with Loop(g, "roll").running() as loop:
        loop.answered_by(reconcile, old_pid)
        roll(reconcile, "4")
        new_pid = new_engine_ready(reconcile, old_pid)
        loop.answered_by(reconcile, new_pid)
    # Through the gateway even a recreate loses nothing: in-flight requests end before
    # the stop, new ones wait for the new engine.
    served(loop, f"pid-{old_pid}", f"pid-{new_pid}")
    reasons = [e.get("reason", "") for e in reconcile.events("roll")]
    assert any("no room for both: recreating" in r for r in reasons), reasons
    g.finish()


@pytest.mark.parametrize("point", sorted(ROLLING_POINTS))
def test_sigkill_mid_promotion_converges(reconcile: Any, gateway: Any, point: str) -> None:
    roll(reconcile, "3")
    reconcile.converge()
    old_pid = reconcile.status("roll")["roll"]["pid"]
    roll(reconcile, "4")
    g = gateway(env={"RECONCILE_FAILPOINTS": f"{point}=kill"})
    assert g.proc.wait(timeout=WAIT) < 0  # killed at the point
    assert reconcile.record("roll@next") is not None
    g2 = gateway()
    new_pid = new_engine_ready(reconcile, old_pid)
    reconcile.wait_gone(old_pid)
    assert reconcile.pids("roll") == {new_pid}  # no leaked engine, nothing killed twice
    answer = g2.post("roll")
    assert answer.status == 200 and answer.json()["system_fingerprint"] == f"pid-{new_pid}"
    g2.finish()


def test_a_drain_answered_before_the_next_daemon_began_ends_at_its_first_pass(
    reconcile: Any, gateway: Any
) -> None:
    # A daemon SIGKILLed mid-promotion after asking the gateway to drain the old engine,
    # which answered at once (nothing in flight), before the next daemon began: that one
    # took the drain over and waited for an answer to come, which had come, so the old
    # engine ran on, the promotion with it, until some other pass came (none here: the
    # drain's deadline, its grace, 60 s). It looks at the answers when it takes over.
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]

    def write(version: str) -> None:
        reconcile.write(
            "roll", devices=GPU, strategy="RollingUpdate", command=echo,
            env={"VERSION": version}, stopGracePeriodSeconds=60,
        )  # fmt: skip

    write("1")
    reconcile.converge()
    old_pid = reconcile.status("roll")["roll"]["pid"]
    write("2")
    point = "executor.promote.after_terminating"
    g = gateway(env={"RECONCILE_FAILPOINTS": f"{point}=kill"})
    assert g.proc.wait(timeout=WAIT) < 0  # killed mid-promotion, the old one draining
    old = reconcile.record("roll")
    assert old is not None and old["phase"] == "Terminating", old
    retire = StateDir(reconcile.state).retire
    reconcile.wait_for(
        lambda: any(retire.glob(f"{old['nonce']}.*.done")), what="the gateway's answer"
    )
    g2 = gateway()
    new_pid = new_engine_ready(reconcile, old_pid)  # within WAIT (40 s), not 60 s on
    reconcile.wait_gone(old_pid)
    assert reconcile.pids("roll") == {new_pid}
    g2.finish()


def test_a_serving_next_kept_for_a_newer_spec_until_the_newest_is_ready(
    reconcile: Any, gateway: Any
) -> None:
    # A daemon SIGKILLed mid-promotion leaves a Ready `@next` that takes the deployment's
    # requests alone (the old one Terminating); the spec changes again before the next
    # daemon. That `@next` was abandoned at once: nothing Ready for seconds, every request
    # a 503 (a chaos trial). It is the last server: promoted, it serves until the newest is
    # Ready, then drains as any promotion's old instance does, its stream in flight ending
    # first (a trial under load once had two streams cut there).
    hold = reconcile.tmp / "hold"  # while it exists, every stream's end waits
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]

    def write(version: str) -> None:
        command = [*echo, "--hold-while", str(hold)]
        reconcile.write(
            "roll",
            devices=GPU,
            strategy="RollingUpdate",
            command=command,
            env={"VERSION": version},
            stopGracePeriodSeconds=30,  # the window to see version 2 drain its stream
        )

    write("1")
    reconcile.converge()
    write("2")
    point = "executor.promote.after_terminating"
    g = gateway(env={"RECONCILE_FAILPOINTS": f"{point}=kill"})
    assert g.proc.wait(timeout=WAIT) < 0  # killed mid-promotion: `@next` serves alone
    nxt, old = reconcile.record(next_name("roll")), reconcile.record("roll")
    assert nxt is not None and nxt["phase"] == "Ready", nxt
    assert old is not None and old["phase"] == "Terminating", old
    retire = StateDir(reconcile.state).retire

    def old_drained() -> bool:  # by the gateway: it sends nothing more there
        return any(retire.glob(f"{old['nonce']}.*.done"))

    reconcile.wait_for(old_drained, timeout=WAIT, what="the old instance drained")
    hold.touch()
    stream = Stream(g.port, "roll")  # on the `@next`, the one engine serving
    assert stream.begun.wait(WAIT) and b"data: " in stream.body, stream.body
    asked = StateDir(reconcile.state).retire_ask(nxt["nonce"])
    with Loop(g, "roll").running() as loop:
        write("3")
        g2 = gateway()

        # The version 2 engine drains once version 3's `@next` is Ready: the gateway is
        # asked before anything stops it (an engine that ends on SIGTERM cuts its stream).
        reconcile.wait_for(
            lambda: asked.exists() or not stream.thread.is_alive(),
            timeout=WAIT,
            what="the version 2 engine drained",
        )
        assert stream.thread.is_alive(), f"the stream was cut: {stream.body!r}"
        promoted = reconcile.record("roll")  # it took the name while it served alone
        assert promoted is not None and promoted["nonce"] == nxt["nonce"], promoted
        newest = reconcile.record(next_name("roll"))
        assert newest is not None and newest["phase"] == "Ready", newest
        hold.unlink()  # the stream may end now: the version 2 engine stops after it
        stream.thread.join(WAIT)

        def version_3_ready() -> bool:
            record = reconcile.record("roll")
            return (
                record is not None
                and record["nonce"] == newest["nonce"]
                and record["phase"] == "Ready"
                and not reconcile.record(next_name("roll"))
            )

        reconcile.wait_for(version_3_ready, timeout=WAIT, what="roll Ready on version 3")
    assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body
    assert b"error" not in stream.body, stream.body
    assert not loop.errors, loop.errors[:5]
    bad = [a for a in loop.answers if a[0] != 200]
    assert not bad, bad[:5]  # something Ready served throughout
    g2.finish()


def test_a_young_gateway_sends_nothing_to_a_starting_next(reconcile: Any, gateway: Any) -> None:
    # The daemon probes every 5 s, the gateway's own look every 10 ms: a request waiting
    # at start makes the gateway see the first engine Ready before the daemon does.
    probe = {"httpGet": {"path": "/health"}, "deadlineSeconds": 60, "periodSeconds": 5}

    def write(load: str, version: str) -> None:
        command = reconcile.demo_command(load_seconds=load, chunks=version)
        reconcile.write(
            "roll", devices=GPU, strategy="RollingUpdate", command=command, readiness=probe
        )

    write("1", "3")
    g = gateway()
    first = g.post("roll")  # waits while the engine loads: the gateway probes it itself
    assert first.status == 200, first
    old = first.json()["system_fingerprint"]
    # The daemon's record Ready first (the gateway asked for that pass): a spec changed
    # while the old one is still Starting on record is a Replace, not a roll (CI once
    # wrote the new spec before that pass ran).
    g.wait_phase("roll", "Ready")
    write("600", "4")  # the new instance stays Starting for the rest of the test
    port = g.wait_phase(next_name("roll"), "Starting")["port"]
    # Once the new engine listens and a pass came after (a refused connection would have
    # kept it out of routing until then), the table alone decides where requests go.
    reconcile.wait_for(lambda: accepts(port), what="the new engine accepting")
    passes = g.text().count('"event": "pass"')
    write("600", "4")  # the same spec again: a folder event, so a pass at once, not in 5 s
    reconcile.wait_for(lambda: g.text().count('"event": "pass"') > passes, what="a pass")
    for _ in range(5):  # the demo engine answers while loading: the pid says who did
        answer = g.post("roll")
        assert answer.status == 200 and answer.json()["system_fingerprint"] == old, answer
    assert reconcile.status()[next_name("roll")]["phase"] == "Starting"
    g.finish()


def test_a_rename_while_rolling_fails_no_request_and_says_renamed(
    reconcile: Any, gateway: Any
) -> None:
    """The deployment is renamed in its file while its `@next` rolls: requests for its
    model go on through the gateway and none fails, the stream the old instance was
    sending included (its engine ends on SIGTERM: a stop without the gateway's drain cut
    it); the old name's instances go saying the file now declares the new name, not
    "manifest removed" (the `@next`'s said it: its file is right there)."""

    def write(name: str, load: str, chunks: str) -> None:
        command = reconcile.demo_command(load_seconds=load, chunks=chunks, chunk_delay="0.1")
        doc = reconcile.deployment(
            name, devices=GPU, strategy="RollingUpdate", command=command, model="chat",
            basePort=reconcile.port, stopGracePeriodSeconds=20,
        )  # fmt: skip
        reconcile.write_text("roll.yaml", reconcile.dump_yaml(doc))

    write("roll", "1", "40")
    g = gateway()
    old_pid = g.wait_phase("roll", "Ready")["pid"]
    with Loop(g, "chat").running(clients=2) as loop:
        loop.answered_by(reconcile, old_pid)
        write("roll", "6", "41")  # loads for 6 s: the rename lands while it does
        g.wait_phase(next_name("roll"), "Starting")  # beside the old one, which serves
        stream = Stream(g.port, "chat")  # on the old one: the only one Ready
        assert stream.begun.wait(WAIT) and b"data: " in stream.body, stream.body
        write("rolled", "6", "41")  # renamed while its `@next` rolls
        new_pid = g.wait_phase("rolled", "Ready")["pid"]
        loop.answered_by(reconcile, new_pid)
    stream.thread.join(WAIT)
    assert stream.body.rstrip().endswith(b"data: [DONE]"), f"cut: {stream.body!r}"
    assert not loop.errors, loop.errors[:5]
    bad = [a for a in loop.answers if a[0] != 200]
    assert not bad, bad[:5]
    reconcile.wait_gone(old_pid)
    reconcile.wait_for(
        lambda: set(reconcile.status()) == {"rolled"}, timeout=WAIT, what="roll's records gone"
    )
    stops = [
        e for name in ("roll", next_name("roll")) for e in reconcile.events(name)
        if e.get("action") in ("stop", "release")
    ]  # fmt: skip
    assert len(stops) == 2, stops  # the old instance's, and the `@next`'s
    for event in stops:
        assert "manifest removed" not in event["reason"], stops
        assert "roll.yaml" in event["reason"] and "rolled" in event["reason"], stops
    g.finish()


def test_an_old_engine_dead_mid_update_hands_over_to_next_and_starts_nothing(
    reconcile: Any, gateway: Any
) -> None:
    # The old engine dies while its `@next` loads. It was replaced (Pending), then placed
    # again with the new spec the next round, on its old device beside the `@next`: a
    # second start of the new model (minutes of GPU time on a real engine), stopped as
    # soon as the `@next` was promoted. Now the `@next` takes the name at once and is the
    # one engine that starts; requests sent after the crash wait for it, and none fails.
    # (None goes to the old engine first: one it was answering would die with it;
    # tests/gateway/test_dead_connection.py holds one sent after on its pooled connection.)
    roll(reconcile, "3")
    g = gateway()
    old_pid, nxt_pid, loaded = rolled_to_a_held_next(reconcile, g)
    nonces = {n: (reconcile.record(n) or {}).get("nonce") for n in ("roll", "roll@next")}
    os.kill(old_pid, signal.SIGKILL)
    reconcile.wait_gone(old_pid)
    with Loop(g, "roll").running() as loop:

        def handed_over() -> dict[str, Any] | None:
            record = reconcile.record("roll")
            return record if record and record["nonce"] != nonces["roll"] else None

        after = reconcile.wait_for(handed_over, timeout=WAIT, what="the old record's end")
        assert after["nonce"] == nonces["roll@next"], after  # the `@next` took the name
        assert reconcile.pids() == {nxt_pid}  # and nothing else started
        loaded.touch()
        new_pid = new_engine_ready(reconcile, old_pid)
        loop.answered_by(reconcile, new_pid)
    assert new_pid == nxt_pid
    assert not loop.errors, loop.errors[:5]
    bad = [a for a in loop.answers if a[0] != 200]
    assert not bad, bad[:5]
    starts = [e for e in reconcile.events("roll") if e.get("action") in ("start", "restart")]
    assert len(starts) == 2, starts  # version 3's, and the `@next`'s: no other
    record = reconcile.record("roll")
    assert record is not None and record["devices"] == ["nvidia:1"], record
    g.finish()
