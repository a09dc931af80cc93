"""Traces (issue 39, the ``otel`` extra): through the real daemon and gateway process,
with ``OTEL_EXPORTER_OTLP_ENDPOINT`` naming a real OTLP/HTTP receiver in the test (an
aiohttp server decoding ``POST /v1/traces`` with opentelemetry-proto):

- one request is one trace: its span continues the client's ``traceparent``, and holds
  ``routing``, ``wait for Ready`` and ``engine``; the engine got a ``traceparent`` of
  that trace whose parent is the engine span;
- a model not Ready that falls back: ``fallback`` and a second ``routing`` in its trace;
- an engine that drops the connection: ``retry`` and a second ``engine`` span;
- unconfigured, a gateway serving a request has imported no opentelemetry module.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from harness.rawhttp import exchange, leaked, request
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from procs import free_ports
from structlog.testing import capture_logs
from test_upstream import BODY, Rude, ready, route

from controller.cli.gateway import gatewayverbs
from controller.core.manifest.names import next_name
from controller.core.state import ProcessRef
from controller.gateway.accounting import requestlog, tracing
from controller.gateway.lifecycle import registry
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.settings import Settings
from controller.redact import redact_url

ECHO = Path(__file__).with_name("echo_engine.py")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"  # no hex, no word (see test_keys.py)
STUCK = {"httpGet": {"path": "/health"}, "deadlineSeconds": 30, "periodSeconds": 0.2}


class Receiver:
    """An OTLP/HTTP trace receiver: every span it was sent, as a dict."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.down = False  # a collector that answers 503 (retryable): each batch is retried
        self.refused = 0  # the posts answered 503
        self.port = free_ports(1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _traces(self, request: web.Request) -> web.Response:
        if self.down:
            self.refused += 1
            return web.Response(status=503)
        sent = ExportTraceServiceRequest.FromString(await request.read())
        for resource in sent.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "service": service.get("service.name"),
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "attrs": {a.key: _value(a.value) for a in span.attributes},
                        }
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in list(self.spans) if s["trace"] == trace_id]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    runner = asyncio.run_coroutine_threadsafe(r._start(), r.loop).result(timeout=30)
    yield r
    asyncio.run_coroutine_threadsafe(runner.cleanup(), r.loop).result(timeout=30)
    r.loop.call_soon_threadsafe(r.loop.stop)
    r.thread.join(timeout=30)
    r.loop.close()


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: the batch goes out soon after a request
    }


def spans_of(reconcile: Any, receiver: Receiver, trace_id: str, *names: str) -> Any:
    def found() -> list[dict[str, Any]] | None:
        spans = receiver.trace(trace_id)
        return spans if set(names) <= {s["name"] for s in spans} else None

    return reconcile.wait_for(found, timeout=30, what=f"spans {names} of trace {trace_id}")


def test_a_restart_from_a_shell_without_the_endpoint_says_traces_end(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """`reconcile gateway restart` starts the gateway with its own shell's environment: run
    from one without OTEL_EXPORTER_OTLP_ENDPOINT, the daemon's traces ended with no word
    (a gateway trial's collector went quiet). It says so, and the next move; a restart
    whose environment sends them where they went says nothing of them."""
    reconcile.write(
        "alpha", command=[sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    )
    g = gateway(env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    first = g.serving()
    endpoint = f"http://127.0.0.1:{receiver.port}/v1/traces"
    assert first.traces == endpoint
    plain = {name: "" for name in tracing.ENDPOINTS}  # a shell without the endpoint
    restarted = reconcile("gateway", "restart", check=0, env=plain)
    second = g.serving()
    assert second.ref != first.ref and second.traces == ""
    warned = f"warning: gateway pid {first.ref.pid} sent traces to {endpoint}; pid "
    assert warned in restarted.err and "sends none" in restarted.err, restarted
    assert "OTEL_EXPORTER_OTLP_ENDPOINT here as the daemon has it" in restarted.err, restarted
    again = reconcile("gateway", "restart", check=0, env=otel_env(receiver))
    assert g.serving().traces == endpoint
    assert "traces" not in again.err, again
    again = reconcile("gateway", "restart", check=0, env=otel_env(receiver))
    assert "traces" not in again.err, again  # the same endpoint: nothing to say
    g.finish()


def test_a_restart_says_where_traces_went_without_the_endpoint_s_secrets(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """The warning of a restart from a shell that sends no traces named the endpoint the
    gateway before sent them to as its environment gave it: a collector's password
    (``http://user:PASSWORD@host``) or token (``?token=``) was printed to the terminal, and
    kept in the state dir's gateway entries it was read from. Both are redacted."""
    reconcile.write(
        "alpha", command=[sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    )
    password, token = "Pw7QzXvKtLmW", "Tk9RwYpNbJdQ"  # no hex, no word: see leaked()
    where = f"127.0.0.1:{receiver.port}/v1/traces"
    endpoint = f"http://collector:{password}@{where}?token={token}"
    g = gateway(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint})
    g.wait_phase("alpha", "Ready")
    plain = {name: "" for name in tracing.ENDPOINTS}  # a shell without the endpoint
    restarted = reconcile("gateway", "restart", check=0, env=plain)
    shown = f"http://collector:<redacted>@{where}?token=<redacted>"
    assert f"sent traces to {shown}; pid " in restarted.err, restarted
    g.finish()
    said = {"restart": restarted.out + restarted.err, "daemon log": g.text()}
    for path in reconcile.state.rglob("*"):
        if path.is_file():
            said[str(path)] = path.read_bytes().decode("latin-1")
    for name, text in said.items():
        assert not leaked(text, [password, token]), (name, leaked(text, [password, token]))


def test_an_older_gateway_s_entry_with_the_endpoint_unredacted_is_no_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gateway before this one kept its endpoint as given, password and all; the one a
    restart starts keeps it redacted. The same endpoint is no change: nothing said (a
    warning naming the same redacted endpoint twice would be); another is, redacted."""
    given = "http://collector:Pw7QzXvKtLmW@127.0.0.1:4318/v1/traces"
    older = _info(1, given)
    gatewayverbs._say_traces(older, _info(2, redact_url(given)))
    assert capsys.readouterr().err == ""
    gatewayverbs._say_traces(older, _info(2, "http://elsewhere:4318/v1/traces"))
    said = capsys.readouterr().err
    assert "sent traces to http://collector:<redacted>@127.0.0.1:4318/v1/traces; " in said
    assert "sends them to http://elsewhere:4318/v1/traces" in said and "Pw7Q" not in said


def _info(pid: int, traces: str) -> registry.GatewayInfo:
    ref = ProcessRef(pid=pid, start_time=0.0)
    return registry.GatewayInfo("n", ref, "127.0.0.1", 8080, "0", "f", {}, 0.0, traces=traces)


def request_span(reconcile: Any, receiver: Receiver, trace_id: str) -> Any:
    """The span of the request of a trace the client began (``CLIENT_SPAN``: its parent)."""

    def found() -> dict[str, Any] | None:
        spans = [s for s in receiver.trace(trace_id) if s["parent"] == CLIENT_SPAN]
        return spans[0] if spans else None

    return reconcile.wait_for(found, timeout=30, what=f"the request's span of {trace_id}")


def test_one_request_is_one_trace_and_the_engine_gets_its_traceparent(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("alpha", command=echo)
    g = gateway(env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    answer = g.post("alpha", headers={"traceparent": traceparent})
    assert answer.status == 200, answer
    sent = answer.json()["headers"]["traceparent"]
    names = ("POST /v1/chat/completions", "routing", "wait for Ready", "engine")
    spans = spans_of(reconcile, receiver, TRACE_ID, *names)
    by = {s["name"]: s for s in spans}
    root = by["POST /v1/chat/completions"]
    assert root["parent"] == CLIENT_SPAN and root["service"] == "reconcile-gateway"
    assert root["attrs"]["http.response.status_code"] == 200
    assert root["attrs"]["reconcile.deployment"] == "alpha"
    assert by["routing"]["parent"] == root["id"]
    assert by["wait for Ready"]["parent"] == by["routing"]["id"]
    engine = by["engine"]
    assert engine["parent"] == by["routing"]["id"] and engine["attrs"]["reconcile.instance"]
    # the peer as OpenTelemetry's HTTP client conventions have it: where, and how asked
    peer = {k: engine["attrs"].get(k) for k in ("server.address", "http.request.method")}
    assert peer == {"server.address": "127.0.0.1", "http.request.method": "POST"}, engine
    assert engine["attrs"]["server.port"] == reconcile.status("alpha")["alpha"]["port"]
    assert sent == f"00-{TRACE_ID}-{engine['id']}-01"  # the engine's parent: the engine span
    # Without a traceparent: a trace of its own, and the engine hears of it.
    answer = g.post("alpha")
    _, trace_id, parent, _ = answer.json()["headers"]["traceparent"].split("-")
    spans = spans_of(reconcile, receiver, trace_id, *names)
    assert parent in {s["id"] for s in spans if s["name"] == "engine"} and len(spans) == 4
    g.finish()


def test_a_fallback_is_in_the_trace(reconcile: Any, gateway: Any, receiver: Receiver) -> None:
    reconcile.write(
        "big",
        command=reconcile.demo_command(load_seconds="600"),
        readiness=STUCK,
        fallbacks=["small"],
        fallbackAfter="1s",
    )
    reconcile.write("small")
    g = gateway(env=otel_env(receiver))
    g.wait_phase("small", "Ready")
    answer = g.post("big", headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert answer.status == 200 and answer.headers["x-reconcile-deployment"] == "small"
    spans = spans_of(reconcile, receiver, TRACE_ID, "fallback", "engine")
    fallback = next(s for s in spans if s["name"] == "fallback")
    assert fallback["attrs"] == {
        "reconcile.from": "big",
        "reconcile.to": "small",
        "reconcile.reason": "not_ready",
    }
    routed = [s["attrs"]["reconcile.model"] for s in spans if s["name"] == "routing"]
    assert sorted(routed) == ["big", "small"]
    g.finish()


def test_an_unknown_model_that_is_a_key_or_not_utf_8_is_traced_and_logged_safely(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """An unknown model is the client's text, kept as sent by the request log and the
    request's span: a client that sent its API key as the model (a swapped argument) had
    the key written to the log and sent to the trace collector; a lone surrogate ("\\ud800",
    valid JSON) failed the span's encoding, a traceback in the gateway's log per request,
    and the span went without its model. The key is named by its label; the surrogate is
    escaped, in the span and the log alike."""
    reconcile.write("alpha", command=reconcile.demo_command())
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(f"{KEY}\n")
    os.chmod(keys, 0o600)
    g = gateway("--api-keys", str(keys), env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    label = hashlib.sha256(KEY.encode()).hexdigest()[:8]
    asked = {KEY: f"(an API key: {label})", "\ud800evil": "\\ud800evil"}
    for n, (model, kept) in enumerate(asked.items()):
        trace_id = f"{TRACE_ID[:-1]}{n}"
        headers = {"x-api-key": KEY, "traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
        answer = g.post(model, headers)
        assert answer.status == 404, answer
        (span,) = spans_of(reconcile, receiver, trace_id, "POST /v1/chat/completions")
        assert span["attrs"].get("gen_ai.request.model") == kept, span
    path = requestlog.path_in(reconcile.state)
    logged = reconcile.wait_for(
        lambda: len(lines := requestlog.read_lines(path)) == 2 and lines, what="2 lines logged"
    )
    assert [line["model"] for line in logged] == list(asked.values()), logged
    g.finish()
    said = g.text()
    assert "Traceback" not in said and '"logger": "opentelemetry' not in said, said[-3000:]
    for one in path.parent.glob("requests.jsonl*"):
        assert not leaked(one.read_bytes().decode("latin-1"), [KEY]), one
    assert not leaked(repr(receiver.spans), [KEY]), receiver.spans


def test_a_key_longer_than_the_shown_cut_sent_as_the_model_is_still_named_by_its_label(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """A multipart upload's model was cut to 512 characters as the form was read: a longer
    key sent as the model was no longer one of the gateway's keys, and its first 256
    characters went to the request log and the trace collector. A long key in a JSON body
    is named by its label too."""
    long_json = ("Qz7WvKpLmRtYuXnJhGNS" * 16)[:300]  # no hex run, no word (see KEY)
    long_form = ("WvKpLmRtYuXnJhGNSQz7" * 40)[:700]
    reconcile.write("alpha", command=reconcile.demo_command())
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(f"{KEY}\n{long_json}\n{long_form}\n")
    os.chmod(keys, 0o600)
    g = gateway("--api-keys", str(keys), env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    mark = "b0undary"
    form = (
        f'--{mark}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{long_form}\r\n'
        f'--{mark}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        f"Content-Type: audio/wav\r\n\r\nRIFF\r\n--{mark}--\r\n"
    ).encode()
    sent = {
        long_json: ("/v1/chat/completions", json.dumps({"model": long_json}).encode(), {}),
        long_form: (
            "/v1/audio/transcriptions",
            form,
            {"Content-Type": f"multipart/form-data; boundary={mark}"},
        ),
    }
    for n, (model, (path, body, extra)) in enumerate(sent.items()):
        trace_id = f"{TRACE_ID[:-1]}{n}"
        headers = {"x-api-key": KEY, "traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01", **extra}
        answer = g.request("POST", path, body, headers)
        assert answer.status == 404, answer
        span = request_span(reconcile, receiver, trace_id)
        label = hashlib.sha256(model.encode()).hexdigest()[:8]
        assert span["attrs"].get("gen_ai.request.model") == f"(an API key: {label})", span
    path = requestlog.path_in(reconcile.state)
    logged = reconcile.wait_for(
        lambda: len(lines := requestlog.read_lines(path)) == 2 and lines, what="2 lines logged"
    )
    labels = [f"(an API key: {hashlib.sha256(m.encode()).hexdigest()[:8]})" for m in sent]
    assert [line["model"] for line in logged] == labels, logged
    shown = reconcile("logs", "--requests", check=0).out
    g.finish()
    for one in path.parent.glob("requests.jsonl*"):
        assert not leaked(one.read_bytes().decode("latin-1"), list(sent), 8), one
    assert not leaked(shown, list(sent), 8), shown
    assert not leaked(repr(receiver.spans), list(sent), 8), receiver.spans


def test_a_client_gone_during_the_first_pass_wait_has_its_key_as_model_logged_as_its_label(
    reconcile: Any,
) -> None:
    """The key check of an unknown model ran after the wait for the daemon's first pass: a
    client that sent its key as the model and went away during that wait had the model
    logged as sent. In process: no first pass comes, the client closes while it waits."""
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(f"{KEY}\n")
    os.chmod(keys, 0o600)
    reconcile.state.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)
    settings = Settings(host="127.0.0.1", port=port, state_dir=reconcile.state, api_keys=keys)
    g = Gateway(settings)
    g.start(lambda: None)
    try:
        front = g.front
        assert front is not None
        body = json.dumps({"model": KEY}).encode()
        raw = request("POST", "/v1/chat/completions", body, {"x-api-key": KEY})

        async def waiters() -> int:  # those awaiting the first pass (asyncio.Event's own)
            return len(front.table.loaded._waiters)  # type: ignore[attr-defined]

        def waiting() -> int:
            return asyncio.run_coroutine_threadsafe(waiters(), g.loop).result(5)

        before = waiting()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(raw)
            reconcile.wait_for(
                lambda: waiting() > before, what="the request waiting for the first pass"
            )
        path = requestlog.path_in(reconcile.state)
        (line,) = reconcile.wait_for(lambda: requestlog.read_lines(path), what="a line logged")
        label = hashlib.sha256(KEY.encode()).hexdigest()[:8]
        assert line["model"] == f"(an API key: {label})", line
    finally:
        g.stop()
    for one in path.parent.glob("requests.jsonl*"):
        assert not leaked(one.read_bytes().decode("latin-1"), [KEY], 8), one
    shown = reconcile("logs", "--requests", check=0).out
    assert not leaked(shown, [KEY], 8) and label in shown, shown


def test_a_path_the_gateway_does_not_route_is_not_the_span_s_name(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """The request's span was named ``POST /path`` for any /v1/... path, an engine's own
    included: each path a client made up (``/v1/x-1``, ``/v1/x-2``...) was a new span
    name, which collectors index and label their span metrics by (an operation each), so
    one key holder made as many as requests. A path the gateway routes names its span
    (``http.route`` too); any other is ``POST``, its path in ``url.path``."""
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("alpha", command=echo)
    g = gateway(env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    named = {"/v1/chat/completions": "POST /v1/chat/completions", "/v1/made-up-7": "POST"}
    for n, (path, name) in enumerate(named.items()):
        trace_id = f"{TRACE_ID[:-1]}{n}"
        headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
        answer = g.request("POST", path, {"model": "alpha"}, headers)
        assert answer.status == 200 and answer.json()["path"] == path, answer
        root = request_span(reconcile, receiver, trace_id)
        assert root["name"] == name and root["attrs"]["url.path"] == path, root
        assert root["attrs"].get("http.route") == (path if name != "POST" else None), root
    g.finish()


def test_a_collector_down_is_said_once_and_once_when_it_is_back(
    reconcile: Any, gateway: Any, receiver: Receiver
) -> None:
    """The OTLP exporter logged a warning on every retry of every batch for as long as the
    collector was down: it is said once, then once when a batch goes through again."""
    reconcile.write("alpha", command=reconcile.demo_command())
    receiver.down = True
    g = gateway(env=otel_env(receiver))
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    # A batch, then two retries of it, refused: the old exporter had said two warnings.
    reconcile.wait_for(lambda: receiver.refused >= 3, timeout=30, what="3 refused posts")
    down = "trace collector not reached"
    said = reconcile.wait_for(lambda: down in (t := g.text()) and t, timeout=30, what="warned")
    assert said.count(down) == 1 and '"logger": "opentelemetry' not in said, said[-3000:]
    (line,) = [line for line in said.splitlines() if down in line]
    assert "Service Unavailable" in line and '"level": "warning"' in line, line
    assert "reconcile gateway restart" in line, line
    receiver.down = False
    answer = g.post("alpha", headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
    assert answer.status == 200, answer
    spans_of(reconcile, receiver, TRACE_ID, "engine")
    back = "trace collector reached again"
    said = reconcile.wait_for(lambda: back in (t := g.text()) and t, timeout=30, what="back")
    assert said.count(down) == 1 and said.count(back) == 1, said[-3000:]
    g.finish()


def test_a_retry_is_in_the_trace(
    reconcile: Any, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that drops the connection before answering: the request goes once more
    to the same instance, then to the other Ready one (test_upstream.py): a ``retry`` span
    with its ``engine`` for each."""
    for name, value in otel_env(receiver).items():
        monkeypatch.setenv(name, value)
    rude, good = Rude(reconcile, "rude"), Rude(reconcile, "good", "--always", "ok")
    reconcile.state.mkdir(parents=True, exist_ok=True)
    inproc = Gateway(Settings(host="127.0.0.1", port=free_ports(1), state_dir=reconcile.state))
    inproc.start(lambda: None)
    try:
        route(inproc, ready("m", "old", good.port), ready(next_name("m"), "new", rude.port))
        headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
        answer = exchange(inproc.settings.port, request("POST", "/v1/reset", BODY, headers))
        assert answer.status == 200 and rude.hits("/v1/reset") == 2, answer
    finally:
        inproc.stop()  # sends what is left of the batch
    spans = spans_of(reconcile, receiver, TRACE_ID, "retry", "engine")
    retries = {s["id"] for s in spans if s["name"] == "retry"}
    engines = [s for s in spans if s["name"] == "engine"]
    assert len(retries) == 2 and len(engines) == 3, spans
    assert sum(s["parent"] in retries for s in engines) == 2, spans


NO_OTEL = """
import json, sys, urllib.request
from pathlib import Path
from controller.gateway.accounting import tracing
from controller.gateway.lifecycle.app import Gateway
from controller.gateway.settings import Settings
state = Path(sys.argv[1])
state.mkdir()
gateway = Gateway(Settings(host="127.0.0.1", port=int(sys.argv[2]), state_dir=state))
gateway.start(lambda: None)
# the records' first look, as the gateway process's watch gives it (else the request waits
# 30 s for a first pass that nobody here makes)
gateway.loop.call_soon_threadsafe(gateway.front.table.update, [])
body = json.dumps({"model": "nobody"}).encode()
url = f"http://127.0.0.1:{sys.argv[2]}/v1/chat/completions"
try:
    urllib.request.urlopen(urllib.request.Request(url, body), timeout=30)
except urllib.error.HTTPError as exc:
    print(exc.code)
gateway.stop()
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_unconfigured_no_opentelemetry_is_imported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    argv = [sys.executable, "-c", NO_OTEL, str(tmp_path / "state"), str(free_ports(1))]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["404", "[]"], done.stdout + done.stderr


def test_what_the_environment_asks() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.configured(endpoint)
    assert tracing.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h/v1/traces"})
    assert not tracing.configured({})
    assert not tracing.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert not tracing.configured({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.configured({**endpoint, "OTEL_SDK_DISABLED": "true"})
    # Where the spans go, as the OTLP exporter spec says.
    assert tracing._endpoint(endpoint) == "http://127.0.0.1:4318/v1/traces"
    assert (
        tracing._endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1/"}) == "http://h:1/v1/traces"
    )
    traces = {**endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:2/in"}
    assert tracing._endpoint(traces) == "http://t:2/in"


WITHOUT_EXTRA = """
import sys
class Absent:  # this interpreter as one where the otel extra is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
from controller.gateway.accounting import tracing
t = tracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
print(t.enabled)
"""


def test_an_endpoint_without_the_extra_says_what_to_install() -> None:
    argv = [sys.executable, "-c", WITHOUT_EXTRA]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr  # the log line: wherever the log goes
    assert done.returncode == 0 and done.stdout.split()[-1] == "False", said
    assert "the otel extra is not installed" in said and "reconcile-engines[otel]" in said
    assert "Traceback" not in said


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://u:hunter2@collector:4317",
            },
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
    ],
)
def test_an_endpoint_without_an_http_scheme_is_said_at_start(
    environ: dict[str, str], variable: str
) -> None:
    """``localhost:4318`` (no scheme): the start said "traces sent by OTLP/HTTP" and every
    batch failed with requests' "No connection adapters were found". One warning at start
    names the variable and the fix (its value without a password), and no traces."""
    with capture_logs() as logs:
        assert not tracing.from_env(environ).enabled
    (said,) = [line for line in logs if line["log_level"] == "warning"]
    assert said["event"] == "no traces: the OTLP endpoint is not an http:// or https:// URL"
    assert said["variable"] == variable and "http://HOST:4318" in said["fix"]
    assert "hunter2" not in str(said)


@pytest.mark.parametrize(
    ("asked", "variable"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        (  # the traces' own variable wins over the general one, as the spec says
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_a_grpc_protocol_asked_is_said_at_start_and_sends_nothing(
    reconcile: Any, gateway: Any, receiver: Receiver, asked: dict[str, str], variable: str
) -> None:
    """``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` (a collector's gRPC port, 4317, in the
    endpoint) was not read: the start said "traces sent by OTLP/HTTP" and each batch went
    by HTTP to a port that speaks gRPC, failing with a reason about the connection. The
    gateway now says at start that only OTLP/HTTP is spoken, naming the variable and the
    fix, and sends no traces (its registry entry names no endpoint)."""
    reconcile.write("alpha", command=reconcile.demo_command())
    g = gateway(env={**otel_env(receiver), **asked})
    g.wait_phase("alpha", "Ready")
    assert g.post("alpha").status == 200
    said = "no traces: only OTLP/HTTP is spoken"
    log = reconcile.wait_for(lambda: said in (t := g.text()) and t, timeout=30, what="warned")
    (line,) = [json.loads(line) for line in log.splitlines() if said in line]
    assert line["variable"] == variable and line["value"] == "grpc", line
    assert "http://HOST:4318" in line["fix"] and line["level"] == "warning", line
    assert "traces sent by OTLP/HTTP" not in log
    assert g.serving().traces == ""
    g.finish()


def test_a_collector_that_never_answers_drops_spans_said_once_not_every_20_s(
    reconcile: Any, gateway: Any
) -> None:
    """A collector that takes the connection and never answers: the export waits out its
    timeout while requests fill the span queue, and the SDK's batch processor said "Queue
    full, dropping Span." under its own logger once per 20 s for as long as that lasted
    (180 lines an hour). It is said once, as the gateway's own warning, for as long as the
    drops go on: past a 20 s window of the SDK's, still once."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # connections wait in the backlog: taken, never answered
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_BSP_MAX_QUEUE_SIZE": "2",  # a request's 4 spans fill it
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1",
    }
    try:
        reconcile.write("alpha", command=reconcile.demo_command())
        g = gateway(env=env)
        g.wait_phase("alpha", "Ready")
        dropped = "trace spans dropped: the export queue is full"

        def said() -> str | None:
            assert g.post("alpha").status == 200  # served all along
            return text if dropped in (text := g.text()) else None

        def served_until(deadline: float) -> bool:
            assert g.post("alpha").status == 200
            return time.monotonic() > deadline

        reconcile.wait_for(said, timeout=60, what="the drops said")
        window = time.monotonic() + 22  # past the SDK's 20 s window: it said it again
        reconcile.wait_for(lambda: served_until(window), timeout=120, what="requests for 22 s")
        log = g.text()
        assert log.count(dropped) == 1, log[-3000:]
        assert "Queue full" not in log and "Queue is full" not in log, log[-3000:]
        g.finish()  # the exit waits at most 5 s for the spans the collector never takes
    finally:
        hole.close()
