"""``fallbacks`` and ``fallbackAfter`` (issue 41): a model with no instance to take a
request sends it to its first fallback that can, named in ``x-reconcile-deployment``,
counted in the metrics and journalled (once a minute per way: a down primary's journal
keeps why it is down); a held stream's waiting comments name the fallback
it waits for once it went there; fallbacks never loop; a fallback that names
nothing, or the deployment itself, is a validation error with its file, line and field."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from clients import stream_begun
from procs import wait_gone
from prometheus_client.parser import text_string_to_metric_families
from test_waiting import raw_answer, raw_stream

from controller.core.kubernetes.export import problems_of
from controller.core.manifest.specs import DeploymentSpec
from controller.core.state import Phase, Record
from controller.gateway.accounting.fallbackevents import WINDOW, FallbackEvents
from controller.gateway.lifecycle import registry
from controller.gateway.routing.concurrency import Limiter
from controller.gateway.routing.table import Table
from controller.gateway.settings import WAITING_ENV
from controller.store.config import accesstoken
from controller.store.sources.manifests import load

ECHO = Path(__file__).with_name("echo_engine.py")
FALLBACKS = "reconcile_gateway_fallbacks_total"
STUCK = {"httpGet": {"path": "/health"}, "deadlineSeconds": 30, "periodSeconds": 0.2}


def manifest(folder: Path, docs: list[dict[str, Any]]) -> Path:
    path = folder / "m.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def doc(name: str, **spec: Any) -> dict[str, Any]:
    body = {"engine": "command", "command": ["/bin/true", "{port}"], **spec}
    return {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": body,
    }


def test_unknown_and_own_names_are_errors_with_file_line_and_field(tmp_path: Path) -> None:
    path = manifest(
        tmp_path,
        [
            doc("a", model="org/a", fallbacks=["b", "nope"]),
            doc("b", model="org/b", fallbacks=["org/b"]),
            doc("c", fallbacks=["a", "org/b"]),
            doc("d", fallbacks=["e"]),  # d <-> e is fine: the gateway never loops
            doc("e", fallbacks=["d"]),
        ],
    )
    result = load([tmp_path])
    found = {(e.name, e.field): e for e in result.errors}
    assert set(found) == {("a", "spec.fallbacks[1]"), ("b", "spec.fallbacks[0]")}, found
    unknown, own = found[("a", "spec.fallbacks[1]")], found[("b", "spec.fallbacks[0]")]
    assert "no deployment serves 'nope'" in unknown.message and "org/b" in unknown.message
    assert "own name" in own.message
    lines = path.read_text().splitlines()
    assert unknown.file == str(path) and lines[unknown.line - 1].strip() == "- nope", unknown
    assert own.line is not None and lines[own.line - 1].strip() == "- org/b", own
    assert set(result.entries) == {"c", "d", "e"}


def test_fallback_after_without_fallbacks_is_an_error_at_its_line(tmp_path: Path) -> None:
    """fallbackAfter did nothing without fallbacks, and was accepted silently."""
    path = manifest(
        tmp_path,
        [doc("a", fallbackAfter="5s"), doc("b", fallbacks=["c"], fallbackAfter="5s"), doc("c")],
    )
    result = load([tmp_path])
    assert set(result.entries) == {"b", "c"}, result.errors
    [error] = result.errors
    assert (error.file, error.field) == (str(path), "spec.fallbackAfter"), error
    assert error.line is not None
    assert path.read_text().splitlines()[error.line - 1].strip() == "fallbackAfter: 5s"
    assert "only applies with fallbacks" in error.message, error
    assert "add fallbacks: [<model>], or remove fallbackAfter" in error.message, error


def metric(reconcile: Any, port: int, name: str, labels: dict[str, str]) -> float | None:
    """The value of one series on the daemon's /metrics (labels in any order)."""
    token = accesstoken.read(reconcile.state)
    url = f"http://127.0.0.1:{port}/metrics?token={token}"
    return metric_in(urllib.request.urlopen(url, timeout=10).read().decode(), name, labels)


def metric_in(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The value of one series in a Prometheus text (labels in any order)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def _big_falls_back_to_small(reconcile: Any, gateway: Any, after: str) -> tuple[Any, int]:
    """``big`` never Ready (Starting), its fallback ``small`` Ready, behind a gateway with
    metrics: the gateway and its metrics port."""
    reconcile.write(
        "big",
        command=reconcile.demo_command(load_seconds="600"),
        readiness=STUCK,
        fallbacks=["small"],
        fallbackAfter=after,
    )
    reconcile.write("small")
    metrics_port = reconcile.port + 14
    g = gateway("--metrics-port", str(metrics_port))
    g.wait_phase("small", "Ready")
    g.wait_phase("big", "Starting")
    return g, metrics_port


def test_a_model_not_ready_falls_back_and_says_so(reconcile: Any, gateway: Any) -> None:
    g, metrics_port = _big_falls_back_to_small(reconcile, gateway, "1s")
    answer = g.post("big")
    assert answer.status == 200, answer
    assert answer.headers["x-reconcile-deployment"] == "small"
    assert answer.json()["model"] == "small"  # the demo engine says who it is
    series = {"model": "big", "to": "small", "reason": "not_ready"}
    reconcile.wait_for(  # the daemon's metrics port shows the gateway's last figures
        lambda: metric(reconcile, metrics_port, "reconcile_gateway_fallbacks_total", series) == 1,
        timeout=30,
        what="the fallback's count",
    )
    reconcile.wait_for(
        lambda: any(e["action"] == "fallback" for e in reconcile.events("big")),
        timeout=30,
        what="the fallback's event",
    )
    g.finish()


def _big_stuck_small_on_demand(reconcile: Any, gateway: Any) -> Any:
    """big never gets Ready (its fallback after 1 s: small); small is OnDemand, Idle, and
    starts in 2 s; waiting comments every 0.2 s."""
    reconcile.write(
        "big",
        command=reconcile.demo_command(load_seconds="600"),
        readiness=STUCK,
        fallbacks=["small"],
        fallbackAfter="1s",
    )
    cold = reconcile.demo_command(load_seconds="2")
    reconcile.write("small", command=cold, activation="OnDemand", readiness=STUCK)
    g = gateway(env={WAITING_ENV: "0.2"})
    g.wait_phase("small", "Idle")
    g.wait_phase("big", "Starting")
    return g


def test_a_held_streams_comments_name_the_fallback_it_waits_for(
    reconcile: Any, gateway: Any
) -> None:
    """big never gets Ready; its fallback small is OnDemand and starts: the comments said
    ``big`` (Starting) while the request waited for it, ``small`` once it went there (they
    named big, Starting, to the end)."""
    g = _big_stuck_small_on_demand(reconcile, gateway)
    status, _, lines = raw_stream(g.port, {"model": "big", "messages": [], "stream": True})
    comments = [line.split(": ")[1] for line in lines if line.startswith(": waiting for ")]
    assert status == 200 and comments[0] == "waiting for big", lines
    assert comments[-1] == "waiting for small", comments
    data = [line for line in lines if line.startswith("data:")]
    assert data[-1] == "data: [DONE]" and '"model": "small"' in data[0], lines
    g.finish()


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_held_stream_names_the_fallback_that_served_it_not_the_primary(
    reconcile: Any, gateway: Any, version: str
) -> None:
    """The comments began (and with them the answer's head) while the request waited for
    big; small served it. The head named big as who served it: now the head names no one
    (it was not known yet), and the deployment that served it is named once known, in a
    comment before the engine's first event and in the ``x-reconcile-deployment`` trailer
    the head announced (HTTP/1.1: chunked; an HTTP/1.0 body has no trailer, nor its head
    the announcement)."""
    g = _big_stuck_small_on_demand(reconcile, gateway)
    body = {"model": "big", "messages": [], "stream": True}
    status, fields, lines, trailers = raw_answer(g.port, body, version)
    assert status == "HTTP/1.1 200 OK", status
    assert any(line.startswith(": waiting for big: Starting ") for line in lines), lines
    named = [f for f in fields + trailers if f.lower().startswith("x-reconcile-deployment:")]
    announced = "Trailer: x-reconcile-deployment" in fields
    if version == "1.1":
        assert named == ["x-reconcile-deployment: small"] and announced, (fields, trailers)
    else:
        assert named == [] and not announced, fields
    data = [line for line in lines if line.startswith("data:")]
    told = lines.index(": x-reconcile-deployment: small")
    assert told < lines.index(data[0]) and '"model": "small"' in data[0], lines
    assert data[-1] == "data: [DONE]", lines
    g.finish()


def test_a_fallback_that_cannot_take_it_passes_it_to_the_next_in_the_list(
    reconcile: Any, gateway: Any
) -> None:
    """big's fallbacks are [gone, small]: gone can never become Ready (Failed), so small,
    the first of the list that can, serves it. It went to gone alone (which has no
    fallbacks of its own) and got gone's 503: the rest of big's list was never tried."""
    reconcile.write(
        "big",
        command=reconcile.demo_command(load_seconds="600"),
        readiness=STUCK,
        fallbacks=["gone", "small"],
        fallbackAfter="1s",
    )
    reconcile.write("gone", command=["/bin/sh", "-c", "exit 3"], restartPolicy="Never")
    reconcile.write("small")
    metrics_port = reconcile.port + 14
    g = gateway("--metrics-port", str(metrics_port))
    g.wait_phase("small", "Ready")
    g.wait_phase("gone", "Failed")
    g.wait_phase("big", "Starting")
    answer = g.post("big")
    assert answer.status == 200 and answer.headers["x-reconcile-deployment"] == "small", answer
    for way in ({"model": "big", "to": "gone"}, {"model": "gone", "to": "small"}):
        series = {**way, "reason": "not_ready" if way["model"] == "big" else "ended"}
        reconcile.wait_for(
            lambda s=series: (
                metric(reconcile, metrics_port, "reconcile_gateway_fallbacks_total", s) == 1
            ),
            timeout=30,
            what=f"the fallback {series} counted",
        )
    g.finish()


def test_a_stream_begun_while_its_first_fallback_waits_names_none_before_the_end(
    reconcile: Any, gateway: Any
) -> None:
    """big's fallbacks are [slow, small]; big gives up at once, slow (whose own fallback is big,
    tried already) within 2 s: the comments begin while the request waits for slow, and small serves
    it. slow alone seemed able to serve it, so the head said slow; the rest of big's list
    could still take it, so the head names no one and the trailer says small."""
    stuck = reconcile.demo_command(load_seconds="600")
    big = {"fallbacks": ["slow", "small"], "fallbackAfter": "0.1s"}  # below a comment's period
    reconcile.write("big", command=stuck, readiness=STUCK, **big)
    slow = {"fallbacks": ["big"], "fallbackAfter": "2s"}  # big was tried: small is big's
    reconcile.write("slow", command=stuck, readiness=STUCK, **slow)
    reconcile.write("small")
    g = gateway(env={WAITING_ENV: "1"})
    g.wait_phase("small", "Ready")
    g.wait_phase("slow", "Starting")
    g.wait_phase("big", "Starting")
    status, fields, lines, trailers = raw_answer(g.port, {"model": "big", "stream": True})
    assert status == "HTTP/1.1 200 OK", status
    assert any(line.startswith(": waiting for slow: Starting ") for line in lines), lines
    named = [f for f in fields + trailers if f.lower().startswith("x-reconcile-deployment:")]
    assert named == ["x-reconcile-deployment: small"], (fields, trailers)
    g.finish()


def test_a_stream_whose_fallback_fails_while_it_waits_names_no_one(
    reconcile: Any, gateway: Any, tmp_path: Path
) -> None:
    """big gives up at once for its one fallback, slow, which alone could serve it, so the
    stream's head (begun while it waited for slow) said `x-reconcile-deployment: slow`;
    slow then failed (exit 3, restartPolicy Never) and the stream ended with the gateway's
    503 as its last event: nothing served it, yet the head named slow. The head now
    announces the trailer, which names no one: no engine answered."""
    gate = tmp_path / "fail-now"  # slow fails once the stream is seen waiting for it
    stuck = reconcile.demo_command(load_seconds="600")
    big = {"fallbacks": ["slow"], "fallbackAfter": "0.1s"}  # below a comment's period
    reconcile.write("big", command=stuck, readiness=STUCK, **big)
    dies = ["/bin/sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.1; done; exit 3"]
    reconcile.write("slow", command=dies, readiness=STUCK, restartPolicy="Never")
    g = gateway(env={WAITING_ENV: "0.5"})
    g.wait_phase("big", "Starting")
    g.wait_phase("slow", "Starting")
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": "big", "stream": True}))
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("x-reconcile-deployment") is None, (
            answer.getheaders()
        )
        assert answer.getheader("Trailer") == "x-reconcile-deployment", answer.getheaders()
        said = b""
        while b": waiting for slow: " not in said:  # each read waits for the next comment
            chunk = answer.read1(4096)
            assert chunk, said
            said += chunk
        gate.touch()
        lines = (said + answer.read()).decode().splitlines()
    finally:
        conn.close()
    (last,) = [line for line in lines if line.startswith("data:") and "error" in line]
    assert "model_not_ready" in last, lines  # the gateway's 503, as the stream's last event
    assert not any(line.startswith(": x-reconcile-deployment:") for line in lines), lines
    g.finish()


@pytest.mark.parametrize("after", ["30s", "1s"], ids=["tries-out", "waits-out"])
def test_a_model_whose_engine_refuses_connections_falls_back(
    reconcile: Any, gateway: Any, after: str
) -> None:
    """big's record says Ready but its engine is gone (it died while no daemon ran: the
    gateway serves on without one): every connection is refused. An instance that cannot
    take the request is a reason to fall back: small serves it. It got 503 `its engine
    could not be reached` after three tries, small never asked. The fallback's reason is
    ``unreachable`` in its metric and its event (it was ``not_ready``: big's record said
    Ready all along). ``waits-out``: a fallbackAfter shorter than the marks the refusals
    put on big's instance: the request waits it out for an instance, and the reason is
    still the refusals (a CI run under load waited out the longer one and said
    ``not_ready``)."""
    reconcile.write("big", fallbacks=["small"], fallbackAfter=after)
    reconcile.write("small")
    g = gateway()
    pid = g.wait_phase("big", "Ready")["pid"]
    g.wait_phase("small", "Ready")
    assert g.stop() == 0  # the daemon ends; its gateway serves on, and nothing restarts big
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    # Past the longest wait the gateway may make before falling back: fallbackAfter (30 s,
    # the client's default timeout too: a CI run timed out where big was waited for that
    # long), the refusals' 5 s marks, and a loaded box's slowness.
    body = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}
    answer = g.request("POST", "/v1/chat/completions", body, timeout=90)
    assert answer.status == 200 and answer.headers["x-reconcile-deployment"] == "small", answer
    # No daemon to ask: the gateway's own metrics file (written within half a second).
    series = {"model": "big", "to": "small", "reason": "unreachable"}
    reconcile.wait_for(
        lambda: metric_in(registry.metrics_text(reconcile.state), FALLBACKS, series) == 1,
        timeout=30,
        what="the fallback counted as unreachable",
    )
    reconcile.wait_for(
        lambda: [e for e in reconcile.events("big") if e["action"] == "fallback"],
        timeout=30,
        what="the fallback's event",
    )
    (event,) = [e for e in reconcile.events("big") if e["action"] == "fallback"]
    assert "could not be reached (connection refused or reset)" in event["reason"], event
    g.finish()


def test_many_fallbacks_leave_one_event(reconcile: Any, gateway: Any) -> None:
    """Eight requests for a model not Ready all go to its fallback and are all counted, but
    journalled once (each was an event: a down primary's journal, trimmed at 64 KB, lost
    why it was down under a few hundred)."""
    g, metrics_port = _big_falls_back_to_small(reconcile, gateway, "0.5s")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: g.post("big"), range(8)))
    assert all(a.headers["x-reconcile-deployment"] == "small" for a in answers), answers
    series = {"model": "big", "to": "small", "reason": "not_ready"}
    reconcile.wait_for(
        lambda: metric(reconcile, metrics_port, "reconcile_gateway_fallbacks_total", series) == 8,
        timeout=30,
        what="the eight fallbacks counted",
    )

    def fallbacks() -> list[dict[str, Any]]:
        return [e for e in reconcile.events("big") if e["action"] == "fallback"]

    reconcile.wait_for(fallbacks, timeout=30, what="the fallback's event")
    assert len(fallbacks()) == 1, fallbacks()
    g.finish()


def test_a_way_is_journalled_once_a_window_with_the_count_it_folded() -> None:
    now = [1000.0]
    events = FallbackEvents(Path("/nonexistent"), clock=lambda: now[0])
    first = events.reason("big", "small", "not_ready", "no instance Ready")
    assert first == "no instance Ready: a request went to 'small'"
    assert events.reason("big", "small", "not_ready", "no instance Ready") is None
    assert events.reason("big", "small", "ejected", "every instance ejected") is not None
    now[0] += WINDOW - 1
    assert events.reason("big", "small", "not_ready", "no instance Ready") is None
    now[0] += 1
    later = events.reason("big", "small", "not_ready", "no instance Ready")
    assert (
        later == "no instance Ready: a request went to 'small' (2 more since the last such event)"
    )
    assert events.reason("big", "small", "not_ready", "no instance Ready") is None


def test_fallbacks_never_loop(reconcile: Any, gateway: Any) -> None:
    """a -> b -> a, both Starting for good: each is tried once, b waiting at most its own
    fallbackAfter (the loop's end), then a 503 naming a (asked for) first, then b and why.
    b waited its whole readiness deadline (here 600 s: the request hung) and its 503 named
    b alone; then it named a without its phase (only b, the last, had it)."""
    for name, other in (("a", "b"), ("b", "a")):
        reconcile.write(
            name,
            command=reconcile.demo_command(load_seconds="600"),
            readiness={**STUCK, "deadlineSeconds": 600},
            fallbacks=[other],
            fallbackAfter="0.5s",
        )
    g = gateway()
    for name in ("a", "b"):  # b too: a fallback the gateway's table lacks is not tried
        g.wait_phase(name, "Starting")
        reconcile.wait_for(lambda n=name: g.request("GET", f"/v1/models/{n}").status == 200)
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
    answer = g.request("POST", "/v1/chat/completions", body, timeout=120)  # not 600 s
    assert answer.status == 503 and answer.json()["error"]["code"] == "model_not_ready", answer
    said = answer.json()["error"]["message"]
    assert said.startswith("tried 'a' (no instance Ready: Starting), then: deployment 'b' "), said
    assert "within its fallbackAfter (0.5s), and no fallback is left to try" in said, said
    g.finish()


def test_a_chains_503_says_why_each_model_was_passed_over(reconcile: Any, gateway: Any) -> None:
    """big (Starting) falls back on gone, then on also (both Failed): the 503 says big's
    phase and gone's phase and why, as it says also's. It said "tried 'big' (no instance
    Ready), then 'gone' (no instance can become Ready (Failed or Succeeded))": why gone
    failed was for the last model tried alone."""
    reconcile.write(
        "big",
        command=reconcile.demo_command(load_seconds="600"),
        readiness=STUCK,
        fallbacks=["gone", "also"],
        fallbackAfter="0.5s",
    )
    for name in ("gone", "also"):
        reconcile.write(name, command=["/bin/sh", "-c", "exit 3"], restartPolicy="Never")
    g = gateway()
    try:
        gone = g.wait_phase("gone", "Failed")
        g.wait_phase("also", "Failed")
        g.wait_phase("big", "Starting")
        for name in ("gone", "also"):  # a fallback the gateway's table lacks is not tried
            reconcile.wait_for(lambda n=name: g.request("GET", f"/v1/models/{n}").status == 200)
        answer = g.post("big")
        assert answer.status == 503, answer
        said = answer.json()["error"]["message"]
        assert said.startswith(
            "tried 'big' (no instance Ready: Starting), then 'gone' (no instance can become "
            f"Ready: gone Failed: {gone['message']}), then: deployment 'also' cannot become "
            "Ready by itself (also Failed: "
        ), said
    finally:
        g.finish()


def test_a_drained_last_fallback_names_the_model_asked_for_first(
    reconcile: Any, gateway: Any
) -> None:
    """big (OnDemand) falls back on lazy (OnDemand), and the node is drained: neither can
    start. The 503 names big, the model asked for, then lazy and the drain; it named lazy
    alone ("deployment 'lazy' cannot start now"), a model the client never asked for."""
    ready = {**STUCK, "deadlineSeconds": 300}
    lazy = {"activation": "OnDemand", "readiness": ready}
    reconcile.write("big", fallbacks=["lazy"], fallbackAfter="0.5s", **lazy)
    reconcile.write("lazy", **lazy)
    g = gateway()
    try:
        g.wait_phase("big", "Idle")
        g.wait_phase("lazy", "Idle")
        reconcile("drain", "--ttl", "1h", "--reason", "swap GPU 1", check=0)
        body = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}
        answer = g.request("POST", "/v1/chat/completions", body, timeout=60)
        assert answer.status == 503, answer
        said = answer.json()["error"]["message"]
        # big's phase is Idle, or Pending held by the drain once a pass read its demand
        # (the request woke it; which one the 503 sees is the pass's timing).
        drained = r"Pending: node drained by .*? \(swap GPU 1\): run `reconcile uncordon` or wait"
        lead = rf"tried 'big' \(no instance Ready: (Idle|{drained})\), then: deployment 'lazy' "
        assert re.match(lead, said), said
        assert "cannot start now: node drained by " in said and "(swap GPU 1)" in said, said
        assert 1 <= int(answer.headers["Retry-After"]) <= 60, answer.headers
        reconcile("uncordon", check=0)
    finally:
        g.finish()


def test_the_tables_fallbacks_and_wait() -> None:
    def rec(name: str, fallbacks: tuple[str, ...], after: float) -> Record:
        return Record(
            name=name,
            owner="o",
            node="n",
            nonce=name,
            port=1,
            phase=Phase.READY,
            models=(name, "pool"),
            fallbacks=fallbacks,
            fallback_after=after,
        )

    table = Table()
    table.update([rec("x", ("p", "q"), 30.0), rec("y", ("q", "r"), 5.0)])
    assert table.fallbacks("pool") == ("p", "q", "r") and table.fallback_after("pool") == 5.0
    assert table.fallbacks("x") == ("p", "q") and table.fallbacks("nope") == ()


def test_the_limiter_says_when_it_is_full() -> None:
    async def check() -> None:
        limiter = Limiter(max_inflight=1, max_queue=0, queue_wait=1.0)
        assert not limiter.full("m")
        assert await limiter.acquire("m")
        assert limiter.full("m") and not limiter.full("other")
        limiter.release("m")
        assert not limiter.full("m")

    asyncio.run(check())


def test_fallbacks_have_no_kubernetes_form() -> None:
    spec = DeploymentSpec.model_validate(
        # a GPU: vLLM's pinned CUDA image with none is an export problem of its own
        {
            "engine": "vllm",
            "model": "x",
            "devices": {"count": 1},
            "fallbacks": ["y"],
            "fallbackAfter": "10s",
        }
    )
    assert spec.fallback_after == 10.0
    assert [p.field for p in problems_of(spec)] == [("spec", "fallbacks")]


def test_a_chain_all_at_its_limits_answers_429_naming_each_model_tried(
    reconcile: Any, gateway: Any
) -> None:
    """big falls back to small; each holds a stream in its one slot (`--max-inflight 1`,
    no queue). A third request for big finds big full, then small full: its 429 names big
    (and why it was passed over) before small, as a chain's 503 does; it named small
    alone, and a client that asked for big was told of a model it never named."""
    hold = reconcile.tmp / "hold"
    hold.touch()
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("big", command=[*echo, "--hold-while", str(hold)], fallbacks=["small"])
    reconcile.write("small", command=[*echo, "--hold-while", str(hold)])
    g = gateway("--max-inflight", "1", "--max-queue", "0")
    held: list[tuple[http.client.HTTPConnection, http.client.HTTPResponse]] = []
    try:
        g.wait_phase("big", "Ready")
        g.wait_phase("small", "Ready")
        for model in ("big", "small"):  # each one's slot taken, its stream held
            conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=60)
            held.append((conn, stream_begun(conn, model)))
        answer = g.post("big")
        assert answer.status == 429, answer
        message = answer.json()["error"]["message"]
        assert message.startswith(
            "tried 'big' (at its concurrency limit), then: deployment 'small' is at its "
            "limit of concurrent requests"
        ), message
    finally:
        hold.unlink()
        for conn, stream in held:
            assert stream.read().endswith(b"data: [DONE]\n\n")
            conn.close()
        g.finish()
