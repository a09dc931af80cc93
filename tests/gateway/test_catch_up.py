"""A name the gateway's table lacks is looked for once more in the records before the
404: the gateway process reads ``instances/`` every 0.1 s, and a request sent the
moment ``status`` shows a new deployment could come before that turn (CI saw
``routable names: none`` for a deployment already Idle on record). In process: the
table's ``catch_up`` stands for the process's look at the folder."""

from __future__ import annotations

import json
import sys
from typing import Any

from harness.rawhttp import exchange, openai_error, request
from procs import accepts, free_ports

from controller.core.state import Phase, Record
from controller.gateway.lifecycle.app import Gateway


def body(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hi"}).encode()


def test_a_name_on_record_since_the_last_look_is_served_not_404(
    reconcile: Any, inproc: Gateway
) -> None:
    port = free_ports(1)
    engine = [sys.executable, "-m", "controller.demo.engine", "--port", str(port), "--model", "m"]
    reconcile.spawn(engine)
    reconcile.wait_for(lambda: accepts(port), what="the engine accepting")
    front = inproc.front
    assert front is not None
    table = front.table
    inproc.loop.call_soon_threadsafe(table.update, [])  # the last look: nothing yet
    reconcile.wait_for(table.loaded.is_set, what="the first look")
    looks: list[str] = []
    rec = Record(
        name="m", owner="o", node="n", nonce="a", port=port, phase=Phase.READY, models=("m",)
    )

    async def look() -> None:  # the folder now holds m's record
        looks.append("look")
        table.update([rec])

    table.catch_up = look
    answer = exchange(inproc.settings.port, request("POST", "/v1/completions", body("m")))
    assert answer.status == 200, answer
    assert looks == ["look"]
    answer = exchange(inproc.settings.port, request("POST", "/v1/completions", body("m")))
    assert answer.status == 200 and looks == ["look"], answer  # known: no look
    # A name nobody declares: one look more, then the 404 naming what exists.
    answer = exchange(inproc.settings.port, request("POST", "/v1/completions", body("nope")))
    error = openai_error(answer)
    assert answer.status == 404 and error is not None, answer
    assert error["code"] == "model_not_found" and "routable names: m" in error["message"]
    assert looks == ["look", "look"]
