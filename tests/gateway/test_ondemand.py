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
    # records the engine Ready by the same probe.
    g.wait_phase("lazy", "Ready", timeout=10)
    assert reconcile.pids("lazy")
    g.wait_phase("lazy", "Idle", timeout=20)
    reconcile.wait_for(lambda: not reconcile.pids("lazy"), timeout=10, what="engine gone")
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
    g.wait_phase("second", "Ready", timeout=10)
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
