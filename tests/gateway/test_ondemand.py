"""OnDemand: Idle until the first request, Ready after it, Idle after its timeout; swapped
out for another OnDemand engine when the GPU is short; a daemon SIGKILLed mid-request."""

from __future__ import annotations

import signal
import threading
from typing import Any

ON_DEMAND = {"activation": "OnDemand", "idleTimeout": "3s"}


def test_idle_then_ready_then_idle(reconcile: Any, gateway: Any) -> None:
    reconcile.write("lazy", **ON_DEMAND)
    g = gateway()
    g.wait_phase("lazy", "Idle")
    assert not reconcile.pids("lazy")
    assert reconcile.status("lazy", cli=True)["lazy"]["phase"] == "Idle"
    answer = g.post("lazy")
    assert answer.status == 200, answer
    # The gateway forwards as soon as its own probe passes; the pass it asked for then
    # records the engine Ready by the same probe. Its Ready lasts the 3 s idleTimeout
    # after the request, which status polls (CLI runs) on a loaded box missed: the
    # journal, which stays, says it was Ready, then parked.
    woke = ["start", "ready", "park"]
    reconcile.wait_for(lambda: _since_start(reconcile, "lazy") == woke, 60, "Ready, then Idle")
    g.wait_phase("lazy", "Idle")
    reconcile.wait_for(lambda: not reconcile.pids("lazy"), 60, "engine gone")
    assert reconcile.record("lazy")["port"] is None  # holds nothing
    g.finish()


def test_swap_when_the_gpu_is_short(reconcile: Any, gateway: Any) -> None:
    reconcile.devices = "nvidia:0"
    gpu = {"count": 1, "kind": "nvidia"}
    reconcile.write("first", devices=gpu, activation="OnDemand", idleTimeout="10m")
    reconcile.write("second", devices=gpu, activation="OnDemand", idleTimeout="10m")
    g = gateway()
    g.wait_phase("first", "Idle")
    assert g.post("first").status == 200
    answer = g.post("second")
    assert answer.status == 200, answer
    g.wait_phase("second", "Ready", timeout=60)  # its idleTimeout is 10 m: no hurry
    status = reconcile.status()
    assert status["first"]["phase"] == "Idle"
    assert any("swapped out for second" in e.get("reason", "") for e in reconcile.events("first"))
    assert g.post("first").status == 200  # and back
    assert reconcile.status()["second"]["phase"] == "Idle"
    g.finish()


def test_sigkill_mid_request_then_a_new_daemon_adopts(reconcile: Any, gateway: Any) -> None:
    reconcile.write("kept", command=reconcile.demo_command(chunks="20", chunk_delay="0.2"))
    reconcile.write("lazy", **ON_DEMAND)
    g = gateway()
    g.wait_phase("kept", "Ready")
    pid = reconcile.status("kept")["kept"]["pid"]
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            g.post("kept", stream=True)
        except Exception as exc:  # the daemon dies mid-answer: expected
            errors.append(exc)

    t = threading.Thread(target=stream)
    t.start()
    assert g.post("lazy").status == 200
    g.stop(signal.SIGKILL)
    g2 = gateway()  # the stream still flows through the gateway that outlives the daemon
    g2.wait_phase("kept", "Ready")
    assert reconcile.status("kept")["kept"]["pid"] == pid  # adopted, not restarted
    assert g2.post("kept").status == 200
    assert g2.post("lazy").status == 200
    g2.wait_phase("lazy", "Idle", timeout=20)
    t.join(timeout=30)
    g2.finish()


def test_a_drained_node_answers_at_once_with_the_drain(reconcile: Any, gateway: Any) -> None:
    """A request for an OnDemand deployment on a drained node gets its 503 at once, with
    Retry-After and who drained the node until when, and what ends it; it waited out the
    whole readiness deadline (here 300 s) for a start the drain never allows. Idle (before
    any pass), then Pending (the pass held it), then uncordoned: served."""
    ready = {"httpGet": {"path": "/health"}, "deadlineSeconds": 300, "periodSeconds": 0.2}
    reconcile.write("lazy", readiness=ready, **ON_DEMAND)
    g = gateway()
    try:
        g.wait_phase("lazy", "Idle")
        reconcile("drain", "--ttl", "1h", "--reason", "swap GPU 1", check=0)
        body = {"model": "lazy", "messages": [{"role": "user", "content": "hi"}]}
        for phase in ("Idle", "Pending"):
            assert reconcile.status("lazy")["lazy"]["phase"] == phase
            answer = g.request("POST", "/v1/chat/completions", body, timeout=20)
            assert answer.status == 503, answer
            said = answer.json()["error"]["message"]
            assert said.startswith("deployment 'lazy' cannot start now: node drained by "), said
            assert "(swap GPU 1): run `reconcile uncordon` or wait" in said, said
            assert 1 <= int(answer.headers["Retry-After"]) <= 60, answer.headers
            g.wait_phase("lazy", "Pending")  # the pass the request asked for held it
        reconcile("uncordon", check=0)
        assert g.post("lazy").status == 200
    finally:
        g.finish()


def _since_start(reconcile: Any, name: str) -> list[str]:
    """The actions journalled for ``name`` from its first start on."""
    actions = [e["action"] for e in reconcile.events(name)]
    return actions[actions.index("start") :] if "start" in actions else []
