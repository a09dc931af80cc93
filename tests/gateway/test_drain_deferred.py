"""A gateway drain before an engine's stop runs in the daemon's deferred stop, not in its
pass: while one engine finishes a long stream, the daemon goes on (another engine's crash
is restarted at once), and the stream still ends whole before its engine is signalled."""

from __future__ import annotations

import os
import signal
from typing import Any

from clients import Stream

from controller.store.statedir import StateDir

WAIT = 60.0


def test_a_crash_is_restarted_while_another_engine_drains_a_stream(
    reconcile: Any, gateway: Any
) -> None:
    """The drain of ``a`` (its spec changed, a stream in flight on it for ~30 s) held the
    daemon's pass: ``b`` killed meanwhile was restarted only once the stream ended."""
    slow = reconcile.demo_command(load_seconds="0", chunks="150", chunk_delay="0.2")  # ~30 s
    reconcile.write("a", command=slow, stopGracePeriodSeconds=60)
    reconcile.write("b", basePort=reconcile.port + 2)
    g = gateway()
    first = g.wait_phase("a", "Ready")["pid"]
    old = g.wait_phase("b", "Ready")["pid"]
    stream = Stream(g.port, "a")
    reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    changed = reconcile.demo_command(load_seconds="0", chunks="3")  # a recreate: drained
    reconcile.write("a", command=changed, stopGracePeriodSeconds=60)
    retire = StateDir(reconcile.state).retire
    reconcile.wait_for(
        lambda: any(retire.glob("*.json")), timeout=WAIT, what="the gateway asked to drain a"
    )
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        b = reconcile.status().get("b", {})
        return b.get("phase") == "Ready" and b.get("pid") not in (None, old)

    reconcile.wait_for(restarted, timeout=WAIT, what="b restarted")
    assert stream.thread.is_alive(), "b was restarted only once a's stream had ended"
    stream.thread.join(timeout=WAIT)
    assert stream.body.rstrip().endswith(b"data: [DONE]"), _why_cut(reconcile, g, stream)

    def recreated() -> bool:
        a = reconcile.status().get("a", {})
        return a.get("phase") == "Ready" and a.get("pid") not in (None, first)

    reconcile.wait_for(recreated, timeout=WAIT, what="a Ready on its new spec")
    g.finish()


def _why_cut(reconcile: Any, g: Any, stream: Stream) -> str:
    """What a stream cut before its end is checked against: a's journal and the daemon's
    lines on a and on drains (a run at load 20 cut it ~16 s in with `upstream_error`, the
    engine's connection closed, and its folder was gone before it could be read)."""
    said = [line for line in g.text().splitlines() if '"a"' in line or "drain" in line]
    journal = "\n".join(map(str, reconcile.events("a")))
    return f"{stream.body[-400:]!r}\n--- a's journal\n{journal}\n--- the daemon on a\n" + (
        "\n".join(said[-60:])
    )


def _killed_mid_drain(reconcile: Any, gateway: Any) -> tuple[int, Stream]:
    """``a`` streaming (~20 s) through a daemon's gateway, its spec changed (a recreate:
    drained), the daemon SIGKILLed once ``a`` is Terminating, its drain asked; the
    gateway serves the stream on. ``a``'s pid, and the stream."""
    slow = reconcile.demo_command(load_seconds="0", chunks="100", chunk_delay="0.2")
    reconcile.write("a", command=slow, stopGracePeriodSeconds=60)
    g = gateway()
    first: int = g.wait_phase("a", "Ready")["pid"]
    stream = Stream(g.port, "a")
    reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    reconcile.write("a", command=reconcile.demo_command(load_seconds="0", chunks="3"))

    def draining() -> bool:
        rec = reconcile.record("a")
        return rec is not None and rec["phase"] == "Terminating" and rec["nonce"] is not None

    reconcile.wait_for(draining, timeout=WAIT, what="a Terminating, its drain asked")
    assert StateDir(reconcile.state).retire_ask(reconcile.record("a")["nonce"]).exists()
    g.proc.kill()
    g.proc.wait(timeout=WAIT)
    return first, stream


def _whole(stream: Stream) -> None:
    stream.thread.join(timeout=WAIT)
    assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    assert b"error" not in stream.body, stream.body[-400:]


def test_a_daemon_killed_while_its_gateway_drains_leaves_the_stream_to_end_whole(
    reconcile: Any, gateway: Any
) -> None:
    """The next daemon's first pass took the killed one's drain for a teardown already
    signalled ("finishing an interrupted teardown") and signalled the engine at once,
    which cut the stream. It takes the drain over: the stream ends whole, then the
    engine is signalled and ``a`` recreated."""
    first, stream = _killed_mid_drain(reconcile, gateway)
    g2 = gateway()
    _whole(stream)

    def recreated() -> bool:
        a = reconcile.status().get("a", {})
        return a.get("phase") == "Ready" and a.get("pid") not in (None, first)

    reconcile.wait_for(recreated, timeout=WAIT, what="a Ready on its new spec")
    g2.finish()


def test_a_once_after_a_daemon_killed_mid_drain_lets_the_stream_end_whole(
    reconcile: Any, gateway: Any
) -> None:
    """A cron `--once` (no daemon now) finishing the killed daemon's teardown signalled
    the engine at once, cutting the stream the gateway still served: it drains first."""
    first, stream = _killed_mid_drain(reconcile, gateway)
    reconcile.once()
    _whole(stream)
    assert reconcile.status()["a"]["pid"] not in (None, first)
    reconcile.down("--gateway")
