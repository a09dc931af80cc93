"""Stops made from the command line through the real daemon, gateway and demo engine:
`drain --evict` and `down NAME` drain the engine from the gateway first, as the daemon's
own stops do (a scale-down, a rolling update, a preemption). The answer it streams ends
whole, then the engine stops; they SIGTERMed it at once and cut the stream mid-way.

The daemon is stopped first (SIGTERM leaves the gateway and the engine serving): its own
pass evicts a drained node's engines too, drained, and would race the verb's stop."""

from __future__ import annotations

from typing import Any

from clients import Stream

WAIT = 60.0


def _streaming(reconcile: Any, gateway: Any) -> tuple[Any, Stream]:
    """The gateway a daemon started, the daemon stopped, and an answer of ``web`` streaming
    through it (~10 s: a verb slow to start under load still finds it streaming)."""
    slow = reconcile.demo_command(load_seconds="0", chunks="100", chunk_delay="0.1")
    reconcile.write("web", command=slow, stopGracePeriodSeconds=60)
    g = gateway()
    g.wait_phase("web", "Ready")
    assert g.stop() == 0
    stream = Stream(g.port, "web")
    reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    return g, stream


def test_drain_evict_lets_the_answer_in_flight_end_whole_then_answers_503(
    reconcile: Any, gateway: Any
) -> None:
    g, stream = _streaming(reconcile, gateway)
    try:
        said = reconcile("drain", "--evict", "--reason", "swap GPU", check=0).out
        assert "evicted web" in said, said
        stream.thread.join(timeout=WAIT)
        assert not stream.thread.is_alive(), "the answer did not end"
        assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
        assert reconcile.status("web")["web"]["phase"] == "Pending"
        answer = g.post("web")
        assert answer.status == 503, answer
        message = answer.json()["error"]["message"]
        assert "node drained by " in message and "(swap GPU)" in message, message
    finally:
        g.finish()


def test_down_of_one_deployment_lets_the_answer_in_flight_end_whole(
    reconcile: Any, gateway: Any
) -> None:
    g, stream = _streaming(reconcile, gateway)
    try:
        said = reconcile("down", "web", check=0).out
        assert "web" in said, said
        stream.thread.join(timeout=WAIT)
        assert not stream.thread.is_alive(), "the answer did not end"
        assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    finally:
        g.finish()
