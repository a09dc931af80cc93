"""Passive health through the real gateway (in process) and real engine processes: an
engine that answers 500 is ejected after three in a row, its replica takes every request
meanwhile, one trial per window decides, and it is taken back once it recovers; through
the daemon's own gateway process the ejection lands in the deployment's journal."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.rawhttp import exchange, openai_error, request
from procs import free_ports
from test_upstream import Rude, ready, route, rude_command

from controller.core.state import Phase, ProbeConfig, Record
from controller.gateway.lifecycle.app import Gateway

ECHO = Path(__file__).with_name("echo_engine.py")
BODY = json.dumps({"model": "m", "prompt": "hi"}).encode()
WINDOW = 2.0  # seconds an ejection lasts here (30 s in production)


def post(gateway: Gateway) -> int:
    status: int = exchange(gateway.settings.port, request("POST", "/v1/x", BODY)).status
    return status


def events(reconcile: Any, action: str) -> list[dict[str, Any]]:
    return [e for e in reconcile.events("m") if e["action"] == action]


def ejections(gateway: Gateway) -> int:
    """The gateway's count of ejections of instance ``m`` (its metrics)."""
    series = 'reconcile_gateway_ejections_total{deployment="m",instance="m",node=""} '
    found = [line for line in gateway.metrics_text().splitlines() if line.startswith(series)]
    return int(float(found[0].split()[-1])) if found else 0  # prometheus-client: "1.0"


def shorten_window(gateway: Gateway) -> None:
    assert gateway.front is not None
    health = gateway.front.table.health
    gateway.loop.call_soon_threadsafe(setattr, health, "window", WINDOW)


def test_an_engine_answering_500_is_ejected_and_taken_back_after_it_recovers(
    reconcile: Any, inproc: Gateway
) -> None:
    g = inproc
    flag: Path = reconcile.tmp / "sick"
    sick = Rude(reconcile, "sick", "--always", "ok", "--fail-while", str(flag))
    good = Rude(reconcile, "good", "--always", "ok")
    shorten_window(g)
    route(g, ready("m", "sick-nonce", sick.port), ready("m@1", "good-nonce", good.port))
    flag.touch()
    first = [post(g) for _ in range(20)]
    # The first three failures reach the client; then only a trial (once per window) may,
    # and each failed trial is one more ejection (counted before its answer goes out).
    assert first.count(500) == sick.hits("/v1/x") == 3 + ejections(g) - 1, first
    assert first.count(200) == good.hits("/v1/x") == 20 - first.count(500), first
    ejected = reconcile.wait_for(lambda: events(reconcile, "eject"), what="the eject event")
    assert ejected[0]["instance"] == "m" and "3 connection failures" in ejected[0]["reason"]

    # Still sick: the window's trial fails and ejects it again; the replica serves meanwhile.
    before, seen = ejections(g), []
    reconcile.wait_for(
        lambda: seen.append(post(g)) or ejections(g) > before, timeout=30, what="a failed trial"
    )
    assert seen.count(500) == 1 and seen[-1] == 500, seen
    assert sick.hits("/v1/x") == 3 + ejections(g) - 1
    again = reconcile.wait_for(lambda: events(reconcile, "eject")[1:], what="the second event")
    assert "trial request failed" in again[0]["reason"]

    # Recovered: the next trial succeeds, it is back, and gets its share again.
    flag.unlink()
    after: list[int] = []
    reconcile.wait_for(
        lambda: after.append(post(g)) or bool(events(reconcile, "readmit")),
        timeout=30,
        what="the readmit event",
    )
    assert set(after) == {200}, after
    before = sick.hits("/v1/x")
    assert {post(g) for _ in range(20)} == {200}
    assert sick.hits("/v1/x") > before
    assert len(events(reconcile, "eject")) == ejections(g)


def test_a_pool_whose_every_instance_is_ejected_answers_503_at_once_with_retry_after(
    reconcile: Any, inproc: Gateway
) -> None:
    g = inproc
    flag: Path = reconcile.tmp / "sick"
    flag.touch()
    sick = Rude(reconcile, "sick", "--always", "ok", "--fail-while", str(flag))
    route(g, ready("m", "sick-nonce", sick.port))
    assert [post(g) for _ in range(3)] == [500, 500, 500]
    answer = exchange(g.settings.port, request("POST", "/v1/x", BODY))
    assert answer.status == 503 and 1 <= int(answer.headers["retry-after"]) <= 30, answer
    error = openai_error(answer)
    assert error is not None and "ejected" in error["message"], answer
    assert sick.hits("/v1/x") == 3


def test_through_the_daemon_an_ejection_is_in_the_deployments_journal(
    reconcile: Any, gateway: Any
) -> None:
    flag: Path = reconcile.tmp / "sick"
    flag.touch()
    reconcile.write("m", command=rude_command("--always", "ok", "--fail-while", str(flag)))
    g = gateway()
    g.wait_phase("m", "Ready")
    assert [g.request("POST", "/v1/x", BODY).status for _ in range(3)] == [500, 500, 500]
    refused = g.request("POST", "/v1/x", BODY)
    assert refused.status == 503 and "ejected" in refused.body.decode(), refused
    shown = reconcile.wait_for(
        lambda: [e for e in reconcile.events("m") if e["action"] == "eject"], what="the event"
    )
    assert shown[0]["instance"] == "m" and "status 500" in shown[0]["reason"], shown
    assert "eject" in reconcile("events", "m", check=0).out
    g.finish()


def test_a_hung_replica_leaves_the_rotation_in_seconds_and_its_requests_go_elsewhere(
    reconcile: Any, inproc: Gateway
) -> None:
    """A SIGSTOP'd replica accepts (the kernel does) and never answers. The gateway looks
    at it once a request has waited a second for its head, finds it answers no GET
    either (it was seen answering one while busy: ``teach``), and ejects it at once; the
    requests it held (nothing of them answered yet) are sent to the other two. No client
    waits for its own timeout (it took a client's timeout per request, three in a row,
    ~13 s, before)."""
    g = inproc
    hung, taught = teach(reconcile, g, "n0")
    health = ProbeConfig(http=(("/health", None),))
    engines = [_demo(reconcile) for _ in range(2)]
    records = [
        replace(ready(n, f"n{i}", p), probe=health)
        for i, (n, (_, p)) in enumerate(zip(("m@1", "m@2"), engines, strict=True), 1)
    ]
    route(g, taught, *records)
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        # At once: least in flight gives each replica two of them, the hung one too.
        with ThreadPoolExecutor(6) as pool:
            timed = list(pool.map(lambda _: _timed_chat(g.settings.port), range(6)))
        assert [status for status, _ in timed] == [200] * 6, timed
        # HEAD_WAIT (1 s) + the look's LOOK_TIMEOUT (2 s), with room for a loaded box.
        assert max(seconds for _, seconds in timed) < 10, timed
        assert ejections(g) == 1
        assert [_chat(g.settings.port, timeout=30) for _ in range(30)] == [200] * 30
        (ejected,) = reconcile.wait_for(lambda: events(reconcile, "eject"), what="the event")
        assert ejected["instance"] == "m" and "no answer within" in ejected["reason"], ejected
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung.pid, signal.SIGCONT)


def test_a_hung_sole_instance_is_ejected_and_its_request_waits_for_it(
    reconcile: Any, inproc: Gateway
) -> None:
    """With nowhere else to go, a request to an engine judged hung is not failed: it waits
    on (an engine wrongly judged still answers it), while new requests get the ejected
    pool's 503 at once instead of hanging too."""
    g = inproc
    proc, _ = teach(reconcile, g, "n0")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_chat, g.settings.port, timeout=30)
            reconcile.wait_for(lambda: ejections(g) == 1, what="the ejection")
            assert _chat(g.settings.port, timeout=10) == 503  # new ones: at once
            os.kill(proc.pid, signal.SIGCONT)
            assert waiting.result() == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)


def test_a_hung_sole_instance_sends_its_waiting_request_to_the_fallback(
    reconcile: Any, inproc: Gateway
) -> None:
    """A SIGSTOP'd sole instance, judged hung and ejected, held its request until the
    liveness probe restarted it (~27 s) although its model has a fallback: DESIGN sends
    a request of a pool all ejected to its fallback, and so this one goes there (nothing
    of its answer came: nothing is repeated)."""
    g = inproc
    proc, taught = teach(reconcile, g, "n0")
    _, port = _demo(reconcile)
    small = Record(
        name="small",
        owner="o",
        node="n",
        nonce="s0",
        port=port,
        phase=Phase.READY,
        models=("small",),
    )
    route(g, replace(taught, fallbacks=("small",)), small)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", g.settings.port, timeout=30)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        conn.request("POST", "/v1/chat/completions", body=body)
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("x-reconcile-deployment") == "small"
        conn.close()
        # HEAD_WAIT (1 s) + the look's LOOK_TIMEOUT (2 s), with room for a loaded box.
        assert time.monotonic() - began < 20 and ejections(g) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)


def test_a_slow_engine_is_looked_at_and_keeps_its_requests(reconcile: Any, inproc: Gateway) -> None:
    """An engine that sends nothing for seconds (a long prefill) while it answers GETs is
    slow, not hung: the gateway's looks find it alive, the request waits for its answer,
    and a stream whose tokens are slow (its head came) is never looked at or cut."""
    g = inproc
    head, hold = reconcile.tmp / "prefill", reconcile.tmp / "tokens"
    port = free_ports(1)
    argv = [sys.executable, str(ECHO), "--port", str(port), "--model", "m"]
    reconcile.spawn([*argv, "--head-while", str(head), "--hold-while", str(hold)])
    reconcile.wait_for(lambda: _chat(port, path="/health") == 200, what="the echo engine")
    route(g, replace(ready("m", "n0", port), probe=ProbeConfig(http=(("/health", None),))))
    hold.touch()
    streamed = http.client.HTTPConnection("127.0.0.1", g.settings.port, timeout=30)
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    streamed.request("POST", "/v1/chat/completions", body=json.dumps(chat))
    answer = streamed.getresponse()  # its head came: its tokens are held (--hold-while)
    assert answer.status == 200
    head.touch()
    with ThreadPoolExecutor(1) as pool:
        prefill = pool.submit(_timed_chat, g.settings.port)
        before = _looks(port)
        reconcile.wait_for(lambda: _looks(port) >= before + 3, timeout=30, what="two looks")
        head.unlink()
        assert prefill.result()[0] == 200
    hold.unlink()
    assert answer.read().endswith(b"data: [DONE]\n\n")
    streamed.close()
    assert ejections(g) == 0


def teach(reconcile: Any, g: Gateway, nonce: str) -> tuple[Any, Record]:
    """An echo engine (a thread a connection: it answers while it computes) routed alone
    as ``m``, and its record, once the gateway has seen it answer a look while a request
    of its waited (routing/hangs.py: only such an engine is judged hung by a look it leaves
    unanswered): the request's head is held until then (``--head-while``), then it is
    answered."""
    head, port = reconcile.tmp / f"prefill-{nonce}", free_ports(1)
    argv = [sys.executable, str(ECHO), "--port", str(port), "--model", "m"]
    proc = reconcile.spawn([*argv, "--head-while", str(head)])
    reconcile.wait_for(lambda: _chat(port, path="/health") == 200, what="the echo engine")
    rec = replace(ready("m", nonce, port), probe=ProbeConfig(http=(("/health", None),)))
    route(g, rec)
    assert g.front is not None
    health = g.front.table.health
    head.touch()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_chat, g.settings.port, timeout=30)
        reconcile.wait_for(lambda: health.answers_busy(nonce), timeout=30, what="the lesson")
        head.unlink()
        assert waiting.result() == 200
    return proc, rec


def _timed_chat(port: int) -> tuple[int, float]:
    began = time.monotonic()
    return _chat(port, timeout=20), time.monotonic() - began


def _looks(port: int) -> int:
    """How many GET /health the echo engine answered (this one's own included)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/looks")
        looks: int = json.loads(conn.getresponse().read())["looks"]
        return looks
    finally:
        conn.close()


def _demo(reconcile: Any) -> tuple[Any, int]:
    """The demo engine (http.server) on a free port, answering."""
    port = free_ports(1)
    argv = [sys.executable, "-m", "controller.demo.engine", "--port", str(port), "--model", "m"]
    proc = reconcile.spawn(argv)
    reconcile.wait_for(lambda: _chat(port, path="/health") == 200, what="the demo engine")
    return proc, port


def _chat(port: int, *, timeout: float = 1.0, path: str = "/v1/chat/completions") -> int:
    """The status of one request, or 0 when the client gave up (its timeout)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    try:
        conn.request("POST" if path.startswith("/v1") else "GET", path, body=body)
        return conn.getresponse().status
    except TimeoutError:
        return 0
    except OSError:
        return -1
    finally:
        conn.close()
