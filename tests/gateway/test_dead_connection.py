"""An engine SIGKILLed with a kept-alive connection in the gateway's pool: the next
request goes out on that connection, which fails before any byte of an answer. It is
sent again on a fresh connection; refused, the instance itself has failed, so the
request goes to another Ready instance, or is held until one is Ready (the restarted
engine, a roll's ``@next``), never answered 502.
"""

from __future__ import annotations

import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from test_rolling import GATED, GPU, roll, rolled_to_a_held_next

from controller.core.manifest.names import next_name

WAIT = 60.0  # a restart, and a start, on a box at load 20+
DYING = Path(__file__).with_name("dying_engine.py")
PROBE = {"httpGet": {"path": "/health"}, "deadlineSeconds": 300, "periodSeconds": 0.2}


def dying(reconcile: Any, *prefix: str) -> list[str]:
    """dying_engine.py's argv: its first life dies under its second request on a
    connection, the gateway's retry of it included; its restarts serve."""
    return [*prefix, sys.executable, str(DYING), "{port}", str(reconcile.tmp / "lives")]


def ask(g: Any, model: str) -> Any:
    """One chat request, waited for as long as a restart takes."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return g.request("POST", "/v1/chat/completions", body, timeout=WAIT)


def served_by(answer: Any) -> str:
    """The engine that answered: its fingerprint names its pid (the demo engine)."""
    assert answer.status == 200, answer
    said: str = answer.json()["system_fingerprint"]
    return said


def killed_then_asked(reconcile: Any, g: Any, model: str, pid: int) -> Any:
    """One request so a connection to ``pid``'s engine is pooled, SIGKILL the engine,
    wait until its process is gone (its sockets closed), and ask again at once."""
    first = g.post(model)
    assert served_by(first) == f"pid-{pid}", first
    os.kill(pid, signal.SIGKILL)
    return ask(g, model)


def test_a_dead_engines_pooled_connection_holds_the_request_until_its_restart(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("lone")
    g = gateway()
    pid = g.wait_phase("lone", "Ready")["pid"]
    answer = killed_then_asked(reconcile, g, "lone", pid)
    restarted = reconcile.status("lone")["lone"]["pid"]
    assert restarted != pid
    assert served_by(answer) == f"pid-{restarted}", answer
    g.finish()


def test_a_dead_engines_pooled_connection_moves_the_request_to_another_replica(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("pair", replicas=2)
    g = gateway()
    pids = {n: g.wait_phase(n, "Ready")["pid"] for n in ("pair", "pair@1")}
    # Each engine gets a pooled connection: requests until both have answered.
    seen: set[str] = set()
    reconcile.wait_for(
        lambda: seen.add(served_by(g.post("pair"))) or len(seen) >= 2,
        timeout=WAIT,
        what="both replicas serving",
    )
    victim = pids["pair"]
    os.kill(victim, signal.SIGKILL)
    reconcile.wait_gone(victim)
    for _ in range(4):  # least in flight: either engine may be chosen for any one
        said = served_by(ask(g, "pair"))
        assert said != f"pid-{victim}", said
    g.finish()


def test_a_dead_old_engines_pooled_connection_waits_for_the_rolls_next(
    reconcile: Any, gateway: Any
) -> None:
    roll(reconcile, "3")
    g = gateway()
    old_pid, nxt_pid, loaded = rolled_to_a_held_next(reconcile, g)
    first = g.post("roll")
    assert served_by(first) == f"pid-{old_pid}", first
    os.kill(old_pid, signal.SIGKILL)
    reconcile.wait_gone(old_pid)
    Path(loaded).touch()  # the `@next` becomes Ready while the request is held
    answer = ask(g, "roll")
    assert served_by(answer) == f"pid-{nxt_pid}", answer
    g.finish()


def test_an_engine_dying_under_a_request_and_its_retry_holds_it_until_its_restart(
    reconcile: Any, gateway: Any
) -> None:
    # A SIGKILL as the gateway sees it, every time: its pooled connection reset, the
    # retry's fresh one reset too, then the port refuses. It was a 502; the request was
    # never answered, so it waits for the restarted engine.
    reconcile.write("dying", command=dying(reconcile))
    g = gateway()
    pid = g.wait_phase("dying", "Ready")["pid"]
    assert served_by(ask(g, "dying")) == f"pid-{pid}"
    answer = ask(g, "dying")
    restarted = reconcile.status("dying")["dying"]["pid"]
    assert restarted != pid
    assert served_by(answer) == f"pid-{restarted}", answer
    assert "then its port refused connections" in g.text()
    g.finish()


def test_an_old_engine_dying_under_a_request_mid_roll_holds_it_for_the_next(
    reconcile: Any, gateway: Any
) -> None:
    loaded = reconcile.tmp / "loaded"  # until it exists, the new version loads
    reconcile.write("roll", devices=GPU, strategy="RollingUpdate", command=dying(reconcile))
    g = gateway()
    old_pid = g.wait_phase("roll", "Ready")["pid"]
    gated = dying(reconcile, sys.executable, "-c", GATED, str(loaded))
    reconcile.write("roll", devices=GPU, strategy="RollingUpdate", command=gated, readiness=PROBE)
    nxt_pid = g.wait_phase(next_name("roll"), "Starting")["pid"]
    assert served_by(ask(g, "roll")) == f"pid-{old_pid}"
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ask, g, "roll")  # the old engine dies under it
        reconcile.wait_gone(old_pid)
        loaded.touch()  # then the `@next` loads, while the request is held
        answer = asked.result(timeout=2 * WAIT)
    assert served_by(answer) == f"pid-{nxt_pid}", answer
    g.finish()
