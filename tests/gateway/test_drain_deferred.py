"""A gateway drain before an engine's stop runs in the daemon's deferred stop, not in its
pass: while one engine finishes a long stream, the daemon goes on (another engine's crash
is restarted at once), and the stream still ends whole before its engine is signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

from clients import Held, Stream

from controller.store.statedir import StateDir

WAIT = 60.0


def test_a_crash_is_restarted_while_another_engine_drains_a_stream(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    """The drain of ``a`` (its spec changed, a stream held in flight on it) held the
    daemon's pass: ``b`` killed meanwhile was restarted only once the stream ended."""
    reconcile.write("a", command=held.command(), stopGracePeriodSeconds=60)
    reconcile.write("b", basePort=reconcile.port + 2)
    g = gateway()
    first = g.wait_phase("a", "Ready")["pid"]
    old = g.wait_phase("b", "Ready")["pid"]
    stream = held.stream(g.port, "a")
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
    held.release()
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


def _killed_mid_drain(reconcile: Any, gateway: Any, held: Held) -> tuple[int, Stream]:
    """``a`` streaming (held) through a daemon's gateway, its spec changed (a recreate:
    drained), the daemon SIGKILLed once ``a`` is Terminating, its drain asked; the
    gateway serves the stream on. ``a``'s pid, and the stream."""
    reconcile.write("a", command=held.command(), stopGracePeriodSeconds=60)
    g = gateway()
    first: int = g.wait_phase("a", "Ready")["pid"]
    stream = held.stream(g.port, "a")
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


def _released_whole(held: Held, first: int, stream: Stream) -> None:
    """Past the moment the old code signalled ``a`` (cutting the stream: its engine
    exits at a SIGTERM), ``a`` still runs: the stream is let end, and ends whole."""
    assert stream.thread.is_alive(), stream.body[-400:]
    os.kill(first, 0)  # ProcessLookupError: a was stopped before its stream ended
    held.release()
    stream.thread.join(timeout=WAIT)
    assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    assert b"error" not in stream.body, stream.body[-400:]


def test_a_daemon_killed_while_its_gateway_drains_leaves_the_stream_to_end_whole(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    """The next daemon's first pass took the killed one's drain for a teardown already
    signalled ("finishing an interrupted teardown") and signalled the engine at once,
    which cut the stream. It takes the drain over: the stream ends whole, then the
    engine is signalled and ``a`` recreated."""
    first, stream = _killed_mid_drain(reconcile, gateway, held)
    g2 = gateway()
    reconcile.wait_for(
        lambda: '"event": "pass"' in g2.text() or not stream.thread.is_alive(),
        timeout=WAIT,
        what="the next daemon's first pass",
    )
    _released_whole(held, first, stream)

    def recreated() -> bool:
        a = reconcile.status().get("a", {})
        return a.get("phase") == "Ready" and a.get("pid") not in (None, first)

    reconcile.wait_for(recreated, timeout=WAIT, what="a Ready on its new spec")
    g2.finish()


def test_a_once_after_a_daemon_killed_mid_drain_lets_the_stream_end_whole(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    """A cron `--once` (no daemon now) finishing the killed daemon's teardown signalled
    the engine at once, cutting the stream the gateway still served: it drains first."""
    first, stream = _killed_mid_drain(reconcile, gateway, held)
    ask = StateDir(reconcile.state).retire_ask(reconcile.record("a")["nonce"])
    before = ask.stat().st_ino
    done: list[Any] = []  # the once's Result (no CLI call meanwhile from this thread)
    once = threading.Thread(target=lambda: done.append(reconcile.once(check=None)))
    once.start()

    def asked_again() -> bool:  # the once's own ask, written anew: it waits on the drain
        with contextlib.suppress(FileNotFoundError):
            return ask.stat().st_ino != before
        return False

    reconcile.wait_for(
        lambda: asked_again() or not stream.thread.is_alive() or not once.is_alive(),
        timeout=WAIT,
        what="the once draining a",
    )
    _released_whole(held, first, stream)
    once.join(timeout=WAIT)
    assert not once.is_alive(), "the once did not end once the stream had"
    assert done and done[0].code == 0, done
    assert reconcile.status()["a"]["pid"] not in (None, first)
    reconcile.down("--gateway")
