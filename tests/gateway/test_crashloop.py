"""A deployment whose every engine exited and waits out its back-off (a crash loop: it
exits at once, again and again) is answered at once: 503 ``model_not_ready`` naming how
it exited and ``reconcile logs NAME``, with ``Retry-After`` at its next restart; with
``fallbacks``, its first fallback takes the request at once. A chaos trial's request for
one was held for its whole readiness deadline (600 s), the `openai` client's timeout.

A first crash restarts at once (no back-off to wait out): a request waits on for that
restart, as for any start. The requests below have a client timeout far below the
deadlines they would otherwise wait for: an answer at all is the proof.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.rawhttp import Raw, openai_error

from controller.core.state import ExitInfo, Phase
from controller.gateway.lifecycle.app import Gateway
from tests.gateway.test_ended import EXITS, LONG, WAIT, starting_engine, waiting_request


def test_a_crash_looping_deployment_is_answered_at_once_and_its_fallback_taken(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("loop", command=EXITS, readiness=LONG)
    reconcile.write(
        "looped", command=EXITS, readiness=LONG, fallbacks=["small"], fallbackAfter="10m"
    )
    reconcile.write("small")
    g = gateway()
    try:
        g.wait_phase("small", "Ready")
        # Past its first restart (at once): it backs off now, its next start 10 s away.
        reconcile.wait_for(
            lambda: reconcile.status("loop").get("loop", {}).get("restarts", 0) >= 1,
            timeout=WAIT,
            what="loop restarted once",
        )
        began = time.monotonic()
        answer = g.post("loop")  # its client gives up after WAIT: an answer is the proof
        assert answer.status == 503, answer
        assert time.monotonic() - began < WAIT
        error = answer.json()["error"]
        assert error["code"] == "model_not_ready", error
        message = error["message"]
        assert "loop BackOff: engine exited with code 3" in message, message
        assert "`reconcile logs loop`" in message, message
        assert "readiness deadline" not in message, message
        assert 1 <= int(answer.headers["Retry-After"]) <= 300, answer.headers
        assert answer.headers.get("x-should-retry") != "false", answer.headers  # it restarts

        # Its fallback serves it at once, not after its fallbackAfter (10m).
        answer = g.post("looped")
        assert answer.status == 200, answer
        assert answer.headers["x-reconcile-deployment"] == "small"
    finally:
        g.finish()


def test_a_request_waiting_for_a_start_is_answered_when_the_engine_backs_off(
    reconcile: Any, inproc: Gateway
) -> None:
    """The wait ends the moment the record says BackOff with its restart ahead, not at the
    deadline; a first crash's BackOff (restart at once) does not end it. In process: the
    test writes the records; a socket that never answers HTTP stands for the engine, and
    the gateway's own probe of each start (made only while a request waits) says the
    request still waits."""
    table, engine, starting = starting_engine(reconcile, inproc)
    answers: list[Raw] = []
    asking = waiting_request(inproc, answers)
    probes = [engine.accept()[0]]  # the gateway probes the engine: the request waits
    try:
        now = datetime.now(UTC)
        exited = ExitInfo(code=3, at=now)
        first = replace(
            starting,
            phase=Phase.BACKOFF,
            backoff_until=now,
            last_exit=exited,
            message="engine exited with code 3; restart now",
        )
        inproc.loop.call_soon_threadsafe(table.update, [first])
        again = replace(starting, nonce="b", restarts=1)
        inproc.loop.call_soon_threadsafe(table.update, [again])
        probes.append(engine.accept()[0])  # its restart is probed: the request waited on
        assert not answers, answers
        backing = replace(
            again,
            phase=Phase.BACKOFF,
            backoff_until=datetime.now(UTC) + timedelta(seconds=20),
            last_exit=exited,
            message="engine exited with code 3; restart in 20s",
        )
        inproc.loop.call_soon_threadsafe(table.update, [backing])
        asking.join(timeout=WAIT)
    finally:
        for probe in probes:
            probe.close()
        engine.close()
    assert answers, "no answer"
    answer = answers[0]
    error = openai_error(answer)
    assert answer.status == 503 and error is not None, answer
    assert 1 <= int(answer.headers["retry-after"]) <= 20, answer.headers
    assert error["code"] == "model_not_ready"
    assert "m BackOff: engine exited with code 3; restart in" in error["message"], error
    assert "`reconcile logs m`" in error["message"], error
