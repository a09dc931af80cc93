"""A request waiting for its OnDemand engine wakes it again when the engine is parked
while it waits: the heartbeat's writes ask the daemon for no pass, so an engine parked
meanwhile (its idleTimeout run out on a heartbeat a loaded host held back: CI's
tests/gateway/test_clock_idle.py, a 503 after 30 s) stayed parked until the request's
deadline. In process: the table's updates stand for the daemon's records."""

from __future__ import annotations

import json
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.rawhttp import Raw, exchange, request
from procs import accepts, free_ports

from controller.core.state import Phase, Record
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.settings import Settings


def lazy(phase: Phase, **fields: Any) -> Record:
    return Record(
        name="lazy",
        owner="o",
        node="n",
        phase=phase,
        models=("lazy",),
        activation="OnDemand",
        idle_timeout=2.0,
        ready_deadline_seconds=60.0,
        **fields,
    )


def test_an_engine_parked_while_a_request_waits_is_woken_again(reconcile: Any) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    settings = Settings(host="127.0.0.1", port=free_ports(1), state_dir=reconcile.state)
    asked: list[str] = []  # the daemon's passes the gateway asked for
    gateway = Gateway(settings)
    gateway.start(lambda: asked.append("pass"))
    try:
        front = gateway.front
        assert front is not None
        table, port = front.table, free_ports(1)
        parked = datetime.now(UTC)
        gateway.loop.call_soon_threadsafe(table.update, [lazy(Phase.IDLE, idle_since=parked)])
        reconcile.wait_for(table.loaded.is_set, what="the first look")

        answers: list[Raw] = []
        body = json.dumps({"model": "lazy", "prompt": "hi"}).encode()
        post = request("POST", "/v1/completions", body)
        client = threading.Thread(
            target=lambda: answers.append(exchange(settings.port, post, timeout=60))
        )
        client.start()
        reconcile.wait_for(lambda: asked, what="the request's pass (its wake)")
        # The daemon starts it, then parks it again while the request still waits.
        starting = lazy(Phase.STARTING, nonce="a", port=port)
        again = lazy(Phase.IDLE, idle_since=parked + timedelta(seconds=5))
        gateway.loop.call_soon_threadsafe(table.update, [starting])
        gateway.loop.call_soon_threadsafe(table.update, [again])
        reconcile.wait_for(lambda: len(asked) >= 2, what="a second pass for the parked engine")
        demand = json.loads((reconcile.state / "activation" / "lazy.json").read_text())
        assert demand["inflight"] == 1, demand  # still wanted: the pass starts it

        # The second start comes up: the request waited for it is answered.
        engine = [sys.executable, "-m", "controller.demo.engine", "--port", str(port)]
        reconcile.spawn([*engine, "--model", "lazy"])
        reconcile.wait_for(lambda: accepts(port), what="the engine accepting")
        ready = lazy(Phase.READY, nonce="b", port=port)
        gateway.loop.call_soon_threadsafe(table.update, [ready])
        client.join(timeout=60)
        assert not client.is_alive() and answers, "the request was not answered"
        assert answers[0].status == 200, answers[0]
        assert len(asked) == 2, asked  # once per park, no more
    finally:
        gateway.stop()
