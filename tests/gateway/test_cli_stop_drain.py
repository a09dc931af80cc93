"""Stops made from the command line through the real daemon, gateway and an engine whose
streams the test holds (clients.Held): `drain --evict` and `down NAME` drain the engine
from the gateway first, as the daemon's own stops do (a scale-down, a rolling update, a
preemption). The answer it streams ends whole, then the engine stops; they SIGTERMed it
at once and cut the stream mid-way.

The daemon is stopped first (SIGTERM leaves the gateway and the engine serving): its own
pass evicts a drained node's engines too, drained, and would race the verb's stop."""

from __future__ import annotations

import os
import threading
from typing import Any

from clients import Held, Stream

from controller.store.statedir import StateDir

WAIT = 60.0


def _streaming(reconcile: Any, gateway: Any, held: Held) -> tuple[Any, Stream, int]:
    """The gateway a daemon started, the daemon stopped, and an answer of ``web`` streaming
    through it, held until the test releases it; the engine's pid."""
    reconcile.write("web", command=held.command(), stopGracePeriodSeconds=60)
    g = gateway()
    pid: int = g.wait_phase("web", "Ready")["pid"]
    assert g.stop() == 0
    stream = held.stream(g.port, "web")
    reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    return g, stream, pid


def _verb(reconcile: Any, held: Held, pid: int, stream: Stream, *args: str) -> Any:
    """``reconcile ARGS`` run while ``web`` streams: once the verb has asked the gateway to
    drain ``web`` (the old verbs signalled the engine at once instead, which ends at a
    SIGTERM and cut the stream), ``web`` still runs, and the stream is let end. The
    verb's result (it waits for the drain, then stops the engine)."""
    done: list[Any] = []  # no CLI call from this thread while the verb runs
    verb = threading.Thread(target=lambda: done.append(reconcile(*args, check=None)))
    verb.start()
    retire = StateDir(reconcile.state).retire
    reconcile.wait_for(
        lambda: any(retire.glob("*.json")) or not stream.thread.is_alive() or not verb.is_alive(),
        timeout=WAIT,
        what="the verb's drain asked",
    )
    assert stream.thread.is_alive(), stream.body[-400:]
    os.kill(pid, 0)  # ProcessLookupError: web was stopped before its answer ended
    held.release()
    verb.join(timeout=WAIT)
    assert not verb.is_alive(), "the verb did not end once the answer had"
    (result,) = done
    assert result.code == 0, str(result)
    stream.thread.join(timeout=WAIT)
    assert not stream.thread.is_alive(), "the answer did not end"
    assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    return result


def test_drain_evict_lets_the_answer_in_flight_end_whole_then_answers_503(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    g, stream, pid = _streaming(reconcile, gateway, held)
    try:
        said = _verb(reconcile, held, pid, stream, "drain", "--evict", "--reason", "swap GPU").out
        assert "evicted web" in said, said
        assert reconcile.status("web")["web"]["phase"] == "Pending"
        answer = g.post("web")
        assert answer.status == 503, answer
        message = answer.json()["error"]["message"]
        assert "node drained by " in message and "(swap GPU)" in message, message
    finally:
        g.finish()


def test_down_of_one_deployment_lets_the_answer_in_flight_end_whole(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    g, stream, pid = _streaming(reconcile, gateway, held)
    try:
        said = _verb(reconcile, held, pid, stream, "down", "web").out
        assert "web" in said, said
    finally:
        g.finish()
