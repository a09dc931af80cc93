"""A deployment that can never become Ready by itself (every instance Failed or
Succeeded: terminal until its manifest changes or ``reconcile restart``) is answered at
once: 503 ``model_not_ready`` naming its phase and why, and what to do, with no
``Retry-After``; with ``fallbacks``, its first fallback takes the request at once, not
after ``fallbackAfter``. A trial's request for a ``restartPolicy: Never`` engine that
exited at once hung for its whole readiness deadline (600 s).

The requests below have a client timeout far below the deadlines they would otherwise
wait for: an answer at all is the proof.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from dataclasses import replace
from typing import Any

import openai
import pytest
from harness.rawhttp import Raw, exchange, openai_error, request
from procs import free_ports

from controller.core.state import Phase, ProbeConfig, Record
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.routing.table import Table

WAIT = 30.0  # a client's patience: far below the 600 s deadlines
EXITS = ["/bin/sh", "-c", "exit 3"]
LONG = {"httpGet": {"path": "/health"}, "deadlineSeconds": 600, "periodSeconds": 0.2}


def test_a_failed_deployment_is_answered_at_once_and_its_fallback_taken(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("never", command=EXITS, restartPolicy="Never", readiness=LONG)
    reconcile.write(
        "broken",
        command=EXITS,
        restartPolicy="Never",
        readiness=LONG,
        fallbacks=["small"],
        fallbackAfter="10m",
    )
    reconcile.write("small")
    g = gateway()
    g.wait_phase("never", "Failed")
    g.wait_phase("broken", "Failed")
    g.wait_phase("small", "Ready")

    answer = g.post("never")
    assert answer.status == 503, answer
    assert "Retry-After" not in answer.headers, answer.headers  # only a person helps
    error = answer.json()["error"]
    assert error["code"] == "model_not_ready", error
    message = error["message"]
    assert "never Failed: engine exited with code 3; restartPolicy Never" in message, message
    assert "fix its manifest" in message and "`reconcile restart never`" in message, message

    # Its fallback serves at once: "cannot take a request" needs no fallbackAfter (10m).
    answer = g.post("broken")
    assert answer.status == 200, answer
    assert answer.headers["x-reconcile-deployment"] == "small"
    reconcile.wait_for(
        lambda: any(
            e["action"] == "fallback" and "can become Ready" in e["reason"]
            for e in reconcile.events("broken")
        ),
        timeout=WAIT,
        what="the fallback's event",
    )
    g.finish()


def test_a_deployment_scaled_to_zero_by_its_manifest_is_answered_at_once(
    reconcile: Any, gateway: Any
) -> None:
    """``replicas: 0`` keeps a deployment declared with nothing running, and nothing
    will start it: its request is refused at once (a Service with no endpoints), final,
    saying how to scale it up. It waited out the readiness deadline (600 s) first."""
    reconcile.write("zero", replicas=0, readiness=LONG)
    reconcile.write("small", basePort=reconcile.port + 5)
    g = gateway()
    g.wait_phase("zero", "Idle")
    g.wait_phase("small", "Ready")

    answer = g.post("zero")  # a client timeout of WAIT: far below the 600 s deadline
    assert answer.status == 503, answer
    assert "Retry-After" not in answer.headers, answer.headers  # only a person helps
    assert answer.headers.get("x-should-retry") == "false", answer.headers
    error = answer.json()["error"]
    assert error["code"] == "model_not_ready", error
    message = error["message"]
    assert "'zero' is scaled to 0 by its manifest (zero: spec.replicas: 0)" in message, message
    assert "raise spec.replicas" in message, message
    assert g.post("small").status == 200  # the pool beside it serves as ever
    g.finish()


def starting_engine(reconcile: Any, inproc: Gateway) -> tuple[Table, socket.socket, Record]:
    """Model ``m``'s one record, Starting, in the in-process gateway's table; a socket that
    never answers HTTP stands for its engine (the gateway's probe of it, made only while
    a request waits, says a request waits)."""
    front = inproc.front
    assert front is not None
    table = front.table
    engine = socket.socket()
    engine.bind(("127.0.0.1", free_ports(1)))
    engine.listen(8)
    engine.settimeout(WAIT)
    starting = Record(
        name="m",
        owner="o",
        node="n",
        nonce="a",
        port=engine.getsockname()[1],
        phase=Phase.STARTING,
        models=("m",),
        ready_deadline_seconds=600.0,
        probe=ProbeConfig(http=(("/health", None),), timeout_seconds=WAIT),
    )
    inproc.loop.call_soon_threadsafe(table.update, [starting])
    reconcile.wait_for(lambda: "m" in table.pools, what="the Starting record")
    return table, engine, starting


def waiting_request(inproc: Gateway, answers: list[Raw]) -> threading.Thread:
    """A request for ``m`` on a thread, its answer (within WAIT) put in ``answers``."""
    body = json.dumps({"model": "m", "prompt": "hi"}).encode()
    asking = threading.Thread(
        target=lambda: answers.append(
            exchange(inproc.settings.port, request("POST", "/v1/completions", body), timeout=WAIT)
        ),
        daemon=True,
    )
    asking.start()
    return asking


def test_a_request_waiting_for_a_start_is_answered_when_the_engine_fails(
    reconcile: Any, inproc: Gateway
) -> None:
    """The wait ends the moment the record says Failed, not at the deadline. In process:
    the test writes the records; a socket that never answers HTTP stands for the engine,
    and the gateway's own probe of it (made only while a request waits) says the request
    is waiting."""
    table, engine, starting = starting_engine(reconcile, inproc)
    answers: list[Raw] = []
    asking = waiting_request(inproc, answers)
    probe, _ = engine.accept()  # the gateway probes the engine: the request waits
    try:
        failed = replace(
            starting.released(),
            phase=Phase.FAILED,
            message="engine exited with code 3; restartPolicy Never",
        )
        inproc.loop.call_soon_threadsafe(table.update, [failed])
        asking.join(timeout=WAIT)
    finally:
        probe.close()
        engine.close()
    assert answers, "no answer"
    answer = answers[0]
    error = openai_error(answer)
    assert answer.status == 503 and error is not None, answer
    assert "retry-after" not in answer.headers, answer.headers
    assert error["code"] == "model_not_ready"
    assert "m Failed: engine exited with code 3" in error["message"], error


def test_a_deployment_whose_manifest_is_invalid_is_answered_with_why(
    reconcile: Any, gateway: Any
) -> None:
    """A manifest that never validated leaves a Pending record that holds nothing and
    cannot start until a person fixes it. Its request got 503 `... is not Ready (Pending)
    within its readiness deadline (0s); retry later` with Retry-After: a deadline it
    never had, and a retry that cannot help. It is answered as an ended one: the error
    and the way out, no Retry-After."""
    reconcile.write("lazy", activation="OnDemand", replicas=2)  # OnDemand starts one engine
    g = gateway()
    g.wait_phase("lazy", "Pending")
    answer = g.post("lazy")
    assert answer.status == 503, answer
    assert "Retry-After" not in answer.headers, answer.headers
    message = answer.json()["error"]["message"]
    assert "lazy Pending: spec invalid (not started)" in message, message
    assert "activation: OnDemand starts one engine" in message and "fix its manifest" in message
    assert "readiness deadline" not in message, message
    g.finish()


def test_an_engine_that_exits_while_its_manifest_is_invalid_is_answered_at_once(
    reconcile: Any, gateway: Any
) -> None:
    """A running engine whose manifest broke (a typo) keeps running; once it exits, its
    record backs off with no restart until the manifest is valid. A request for it waited
    out the readiness deadline (600 s) for a restart only a person can bring: it is
    answered as an ended one, at once, with the way out and no Retry-After."""
    reconcile.write("typo", readiness=LONG)
    g = gateway()
    try:
        pid = g.wait_phase("typo", "Ready")["pid"]
        reconcile.write("typo", readiness=LONG, env={"PORT": "9000"})  # refused: invalid
        reconcile.wait_for(
            lambda: reconcile.status("typo")["typo"].get("spec_valid") is False,
            timeout=WAIT,
            what="the manifest judged invalid",
        )
        os.kill(pid, signal.SIGKILL)
        # Its exit is recorded as a back-off with no restart ("no restart until its
        # manifest is valid"), a pass later said as "spec invalid (engine not running)".
        reconcile.wait_for(
            lambda: reconcile.status("typo")["typo"].get("phase") == "BackOff",
            timeout=WAIT,
            what="the exit recorded",
        )
        answer = g.post("typo")  # its client gives up after WAIT: an answer is the proof
        assert answer.status == 503, answer
        assert "Retry-After" not in answer.headers, answer.headers
        message = answer.json()["error"]["message"]
        assert "cannot become Ready by itself" in message, message
        # the record's words at either pass: the exit, or the manifest's error
        assert "typo BackOff: " in message and "fix its manifest" in message, message
        assert "no restart until its manifest is valid" in message or (
            "spec invalid (engine not running)" in message and "spec.env.PORT" in message
        ), message
        assert "readiness deadline" not in message, message
    finally:
        g.finish()


def test_the_official_client_does_not_retry_what_only_a_person_can_fix(
    reconcile: Any, gateway: Any
) -> None:
    """The `openai` client retries every 5xx twice (with backoff) unless the answer says
    `x-should-retry: false`: a request for a Failed deployment was sent three times, three
    503s in the request log and the 5xx count for one user's one call, and its error came
    a second and more late. The 503 says no retry can help."""
    reconcile.write("never", command=EXITS, restartPolicy="Never", readiness=LONG)
    g = gateway()
    try:
        g.wait_phase("never", "Failed")
        answer = g.post("never")
        assert answer.status == 503 and answer.headers["x-should-retry"] == "false", answer
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="none")
        with client, pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model="never", messages=[])  # max_retries: 2
        assert refused.value.status_code == 503
        assert g.post("marker-after").status == 404  # logged in order: after the client's
        log = reconcile.state / "gateway" / "requests.jsonl"
        lines = reconcile.wait_for(
            lambda: "marker-after" in (text := log.read_text()) and text.splitlines(),
            what="the marker's line in the request log",
        )
        models = [json.loads(line)["model"] for line in lines]
        assert models == ["never", "never", "marker-after"], models  # the raw post, the client
    finally:
        g.finish()
