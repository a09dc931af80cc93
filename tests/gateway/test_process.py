"""The gateway process outlives the daemon (issue 22): real daemons, gateway processes,
engines and sockets.

- the daemon SIGKILLed and restarted 5 times under 8 client loops (half streaming):
  no failed request, no cut stream, the same gateway process adopted each time, and
  nothing left running once ``down --gateway`` ran;
- an OnDemand request that arrives with no daemon waits for the next one;
- a second gateway process takes the port over under load (``reconcile gateway
  restart``): no failed request; the daemon follows the successor (SIGHUP's key reload
  reaches it, its crash is restarted); a request whose body comes after the hand-over
  is answered by the old one; one waiting for an engine to get Ready is answered 503
  (``Retry-After: 1``) at once; (slow) 12 hand-overs in a row under load;
- a gateway crash (SIGKILL) is restarted by the daemon at once; ``reconcile gateway
  stop`` is no crash (left stopped until SIGHUP); SIGTERM of the daemon leaves it serving;
- the gateway's counters run on across a hand-over, and across two in a row while the
  oldest gateway still drains a stream: the last one counts every request.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from clients import stream_begun
from procs import GATEWAY_MARKER, marked_pids

from controller.cli.gateway.startlock import stopped
from controller.store.config import accesstoken

WAIT = 40.0
ECHO = Path(__file__).with_name("echo_engine.py")
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"  # no hex, no word (see test_keys.py)
OTHER = "sk-Vb8NcXeRwTqPoIuYtLk2"


@dataclass
class Loop:
    """A client sending requests back to back (a new connection each, as curl does);
    ``stream``: each answer must end with ``data: [DONE]``, else it was cut."""

    port: int
    model: str
    stream: bool
    headers: dict[str, str] = field(default_factory=dict)
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def once(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}]}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps({**body, "stream": self.stream}),
                self.headers,
            )
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:  # reset, refused, cut short
            self.failed.append(repr(exc))
            return
        finally:
            conn.close()
        if resp.status != 200:
            self.failed.append(f"{resp.status} {data[:200]!r}")
        elif self.stream and b"data: [DONE]" not in data:
            self.cut.append(repr(data[-200:]))
        else:
            self.ok += 1

    def run(self) -> None:
        while not self.stop.is_set():
            self.once()


class Load:
    """``n`` loops at once, half of them streaming."""

    def __init__(self, port: int, model: str, n: int, headers: dict[str, str] | None = None):
        self.loops = [Loop(port, model, i % 2 == 0, dict(headers or {})) for i in range(n)]
        self.threads = [threading.Thread(target=lp.run, daemon=True) for lp in self.loops]

    @property
    def ok(self) -> int:
        return sum(lp.ok for lp in self.loops)

    def more(self, rc: Any, n: int, what: str) -> None:
        """Wait until ``n`` more requests succeeded (the gateway serves meanwhile)."""
        target = self.ok + n
        rc.wait_for(lambda: self.ok >= target, timeout=WAIT, what=what)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for lp in self.loops:
            lp.stop.set()
        for t in self.threads:
            t.join(timeout=WAIT)

    def check(self) -> None:
        failed = [f for lp in self.loops for f in lp.failed]
        cut = [c for lp in self.loops for c in lp.cut]
        assert (failed, cut) == ([], []), (
            f"{len(failed)} failed, {len(cut)} cut: {failed[:5]} {cut[:3]}"
        )
        assert self.ok > 0


def gateway_pids(rc: Any) -> set[int]:
    return marked_pids(f"{rc.node}/", GATEWAY_MARKER)


def streaming(rc: Any, name: str, **spec: Any) -> None:
    """A demo deployment whose streams last a while (5 chunks, 20 ms apart): killing
    anything mid-stream would cut some."""
    rc.write(name, command=rc.demo_command(chunks="5", chunk_delay="0.02"), **spec)


def hand_over(rc: Any, old: Any) -> None:
    """``reconcile gateway restart``: a new gateway takes the port over from ``old``."""
    took = rc("gateway", "restart", check=0)
    assert f"took it over from pid {old.ref.pid}" in took.out, took


def said(g: Any, event: str) -> int:
    return sum(f'"event": "{event}' in line for line in g.text().splitlines())


def test_daemon_sigkilled_and_restarted_five_times_under_load(reconcile: Any, gateway: Any) -> None:
    streaming(reconcile, "alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    serving = g.serving()
    with Load(g.port, "alpha", 8) as load:
        load.more(reconcile, 16, "answers with the first daemon")
        for round_ in range(5):
            assert g.stop(signal.SIGKILL) == -signal.SIGKILL
            # No daemon at all now: the gateway serves Ready engines on.
            load.more(reconcile, 16, f"answers with no daemon (round {round_})")
            g = gateway(port=g.port)
            adopted = lambda d=g: said(d, "gateway adopted")  # noqa: E731
            reconcile.wait_for(adopted, timeout=WAIT, what="adopted")
            load.more(reconcile, 16, f"answers after restart {round_}")
    load.check()
    # Adopted every time: the very process the first daemon started.
    assert g.serving().ref == serving.ref
    assert said(g, "gateway started") == 0
    g.finish()
    assert reconcile.pids() == set() and gateway_pids(reconcile) == set()


def test_ondemand_request_waits_for_the_next_daemon(reconcile: Any, gateway: Any) -> None:
    reconcile.write("lazy", activation="OnDemand", idleTimeout="10m")
    g = gateway()
    g.wait_phase("lazy", "Idle")
    g.stop(signal.SIGKILL)
    answers: list[Any] = []
    asking = threading.Thread(target=lambda: answers.append(g.post("lazy")), daemon=True)
    asking.start()
    # The gateway wrote the demand; nobody passes until a daemon comes back.
    activation = Path(reconcile.state, "activation", "lazy.json")
    reconcile.wait_for(activation.exists, timeout=WAIT, what="the activation")
    assert answers == [] and reconcile.status("lazy")["lazy"]["phase"] == "Idle"
    g = gateway(port=g.port)
    asking.join(timeout=WAIT)
    assert answers and answers[0].status == 200, answers
    g.finish()


def test_a_wait_that_no_daemon_could_end_says_so(reconcile: Any, gateway: Any) -> None:
    """The gateway outlives the daemon, and an OnDemand request waits for the next one; a
    trial's request then got "not Ready (Idle) within its readiness deadline (60s); retry
    later" after the wait, with no word that no daemon ran to start the engine: the
    client retried for nothing and the operator learnt nothing. The 503 says so now."""
    quick = {"httpGet": {"path": "/health"}, "deadlineSeconds": 2, "periodSeconds": 0.2}
    reconcile.write("lazy", activation="OnDemand", idleTimeout="10m", readiness=quick)
    g = gateway()
    g.wait_phase("lazy", "Idle")
    assert g.stop() == 0  # SIGTERM: the daemon ends, its gateway serves on
    answer = g.post("lazy")
    assert answer.status == 503, answer
    message = answer.json()["error"]["message"]
    assert "is not Ready (Idle) within its readiness deadline (2s)" in message, message
    assert f"no daemon runs on its state dir ({reconcile.state})" in message, message
    assert "the operator starts the daemon, then retry" in message, message
    g.finish()


def test_a_wait_that_a_stopped_daemon_could_not_end_says_so(reconcile: Any, gateway: Any) -> None:
    """A daemon SIGSTOPped (a debugger; a VM paused) holds its lock but starts nothing: the
    503 after the wait said "retry later", as if the engine were on its way."""
    quick = {"httpGet": {"path": "/health"}, "deadlineSeconds": 2, "periodSeconds": 0.2}
    reconcile.write("lazy", activation="OnDemand", idleTimeout="10m", readiness=quick)
    g = gateway()
    g.wait_phase("lazy", "Idle")
    g.proc.send_signal(signal.SIGSTOP)
    try:
        reconcile.wait_for(lambda: stopped(g.proc.pid), what="the daemon stopped")
        answer = g.post("lazy")
    finally:
        g.proc.send_signal(signal.SIGCONT)
    assert answer.status == 503, answer
    message = answer.json()["error"]["message"]
    assert "is not Ready (Idle) within its readiness deadline (2s)" in message, message
    pid = g.proc.pid
    assert f"the daemon (pid {pid}) on its state dir is stopped" in message, message
    assert f"until the daemon runs again (kill -CONT {pid}), then retry" in message, message
    g.wait_phase("lazy", "Ready")  # running again, it meets the demand the request left
    g.finish()


def _keyfile(reconcile: Any, *keys: str) -> Path:
    path: Path = reconcile.tmp / "keys.txt"
    path.write_text("\n".join(keys) + "\n")
    os.chmod(path, 0o600)
    return path


def test_connections_the_old_gateway_accepted_are_answered_after_the_hand_over(
    reconcile: Any, gateway: Any
) -> None:
    """Two connections the old gateway accepted before the hand-over, answered by it after
    (one start and hand-over for both, each ~5 s under load):

    - the cause of the rare reset under load: a connection the old gateway accepted whose
      request it had not read yet when it stopped accepting was closed as idle. Here the
      request comes 2 s after the hand-over (it took a loaded client that long once);
    - the cause of the rare stall under load: the old gateway's drain told aiohttp to
      close a connection after its request, and aiohttp then dropped every byte that came,
      so a request whose body had not arrived yet waited for it until its client gave up.
      Here the headers come before the hand-over and the body 2 s after it."""
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    old = g.serving()
    body = json.dumps({"model": "alpha", "messages": [{"role": "user", "content": "hi"}]})
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    early = http.client.HTTPConnection("127.0.0.1", g.port, timeout=WAIT)
    early.connect()  # only the old gateway holds the socket: it accepts this one
    halfway = socket.create_connection(("127.0.0.1", g.port), timeout=WAIT)
    try:
        halfway.sendall(head.encode())
        reconcile.wait_for(lambda: _accepted_by(old.ref.pid, early), timeout=WAIT, what="accepted")
        reconcile.wait_for(lambda: _holds(old.ref.pid, halfway), timeout=WAIT, what="accepted")
        hand_over(reconcile, old)
        time.sleep(2.0)
        halfway.sendall(body.encode())
        rest = http.client.HTTPResponse(halfway)
        rest.begin()
        assert rest.status == 200, rest.read()
        assert rest.getheader("Connection") == "close"
        assert b"hello from alpha" in rest.read()
        # The idle one's request comes 2 s after the old gateway last had one in flight
        # (as alone: a drain that ends with its last request would close it).
        time.sleep(2.0)
        early.request("POST", "/v1/chat/completions", body)
        answer = early.getresponse()
        assert answer.status == 200, answer.read()
        # The old gateway answered it, and said it ends the connection.
        assert answer.getheader("Connection") == "close"
        answer.read()
    finally:
        early.close()
        halfway.close()
        g.finish()


def _accepted_by(pid: int, conn: http.client.HTTPConnection) -> bool:
    """The process ``pid`` holds the server end of ``conn`` (it accepted it)."""
    assert conn.sock is not None
    return _holds(pid, conn.sock)


def _holds(pid: int, sock: socket.socket) -> bool:
    """The process ``pid`` holds the server end of ``sock`` (it accepted it)."""
    ours = sock.getsockname()
    return any(
        tuple(c.raddr) == ours for c in psutil.Process(pid).net_connections("tcp") if c.raddr
    )


def test_a_request_waiting_for_an_engine_is_answered_503_at_the_hand_over(
    reconcile: Any, gateway: Any
) -> None:
    """A trial's request waiting for an engine that never got Ready was held by the old
    gateway through its whole drain (120 s), then closed with no answer at all, and logged
    500. It has sent nothing to any engine: the old gateway answers it at once, 503 with
    ``Retry-After: 1`` and ``Connection: close``, and the retry reaches the new one."""
    _stuck(reconcile)
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    g.wait_phase("stuck", "Idle")
    old = g.serving()
    answers, asking = _ask_stuck(g)
    try:
        # The old gateway holds the request: it wrote the demand with it in flight.
        _wait_held(reconcile)
        hand_over(reconcile, old)
        asking.join(timeout=WAIT)  # far below the drain's 120 s
        assert answers, "the waiting request got no answer"
        answer = answers[0]
        assert answer.status == 503, answer
        assert answer.headers.get("Retry-After") == "1", answer.headers
        assert answer.headers.get("Connection") == "close", answer.headers
        error = answer.json()["error"]
        assert error["code"] == "model_not_ready", error
        assert "stopping (handed over)" in error["message"], error
        # The retry's way: the new gateway serves the port (a Ready deployment answers).
        ok = g.post("alpha")
        assert ok.status == 200, ok
        assert g.serving().ref != old.ref
        # The request log says what was sent: the 503, never a 500.
        log = Path(reconcile.state, "gateway", "requests.jsonl")

        def logged() -> list[int]:
            lines = log.read_text().splitlines() if log.exists() else []
            return [json.loads(line)["status"] for line in lines if '"stuck"' in line]

        reconcile.wait_for(logged, timeout=WAIT, what="the request's line")
        assert logged() == [503], logged()
    finally:
        g.finish()


def _stuck(reconcile: Any) -> None:
    """An OnDemand deployment whose engine never gets Ready: a request for it waits."""
    reconcile.write(
        "stuck",
        command=reconcile.demo_command(load_seconds="3600"),  # /health answers 503 all along
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 3600, "periodSeconds": 0.2},
        activation="OnDemand",
        idleTimeout="10m",
    )


def _ask_stuck(g: Any) -> tuple[list[Any], threading.Thread]:
    """A request for `stuck`, sent on a thread: its answer lands in the list."""
    answers: list[Any] = []
    asking = threading.Thread(target=lambda: answers.append(g.post("stuck")), daemon=True)
    asking.start()
    return answers, asking


def _wait_held(reconcile: Any) -> None:
    """Until the serving gateway holds the request: its demand file counts it in flight."""
    activation = Path(reconcile.state, "activation", "stuck.json")

    def waiting() -> bool:
        try:
            return bool(json.loads(activation.read_text()).get("inflight", 0) > 0)
        except (OSError, ValueError):
            return False

    reconcile.wait_for(waiting, timeout=WAIT, what="the request waiting for stuck")


def test_a_request_waiting_for_an_engine_at_a_stop_is_told_what_starts_a_gateway(
    reconcile: Any, gateway: Any
) -> None:
    """`reconcile gateway stop` while a request waits for its engine: the 503 said "retry:
    after a hand-over the new gateway serves the port", but a stop leaves none (a gateway
    trial's client retried into a refused connection). It names what starts one."""
    _stuck(reconcile)
    g = gateway()
    g.wait_phase("stuck", "Idle")
    answers, asking = _ask_stuck(g)
    try:
        _wait_held(reconcile)
        assert "stopped gateway pid" in reconcile("gateway", "stop", check=0).out
        asking.join(timeout=WAIT)  # far below the drain's 120 s
        assert answers, "the waiting request got no answer"
        answer = answers[0]
        assert (answer.status, answer.headers.get("Retry-After")) == (503, "1"), answer
        message = answer.json()["error"]["message"]
        assert "stopping (SIGTERM)" in message and "`reconcile gateway start`" in message, message
        assert "hand-over" not in message and "new gateway" not in message, message
    finally:
        g.finish()


def test_a_second_gateway_takes_the_port_over_under_load(reconcile: Any, gateway: Any) -> None:
    streaming(reconcile, "alpha")
    keys = _keyfile(reconcile, KEY)
    g = gateway("--api-keys", str(keys))
    g.wait_phase("alpha", "Ready")
    old = g.serving()
    try:
        _take_over_under_load(reconcile, g, old)
    finally:  # a failed check still ends the daemon, the gateways and the engines
        g.finish()
    assert gateway_pids(reconcile) == set()


def _take_over_under_load(reconcile: Any, g: Any, old: Any) -> None:
    with Load(g.port, "alpha", 6, {"x-api-key": KEY}) as load:
        load.more(reconcile, 16, "answers from the first gateway")
        hand_over(reconcile, old)
        new = g.serving()
        assert new.ref != old.ref
        # The old one finishes what it holds and exits (it handed its socket over).
        reconcile.wait_for(lambda: not old.alive(), timeout=WAIT, what="the old gateway gone")
        load.more(reconcile, 16, "answers from the new gateway alone")
    load.check()
    reconcile.wait_for(lambda: said(g, "gateway handed over"), timeout=WAIT, what="followed")
    log = (reconcile.state / "gateway" / "gateway.log").read_text()
    assert '"handed_over": true' in log, log[-2000:]
    # The daemon follows the successor: SIGHUP reaches it (keys re-read)...
    _keyfile(reconcile, OTHER)
    g.proc.send_signal(signal.SIGHUP)
    reconcile.wait_for(
        lambda: g.post("alpha", {"x-api-key": OTHER}).status == 200, what="the new key"
    )
    assert g.post("alpha", {"x-api-key": KEY}).status == 401
    # ... and its crash is restarted.
    os.kill(new.ref.pid, signal.SIGKILL)
    reconcile.wait_for(
        lambda: (i := g.serving_or_none()) is not None and i.ref != new.ref,
        timeout=WAIT,
        what="a restarted gateway",
    )
    assert g.post("alpha", {"x-api-key": OTHER}).status == 200


@pytest.mark.slow
def test_twelve_hand_overs_in_a_row_under_load(reconcile: Any, gateway: Any) -> None:
    """The soak that found the drain's stall (about one hand-over in 30 held a request
    until its client gave up, on a loaded box): 12 loops, 12 hand-overs, none failed."""
    streaming(reconcile, "alpha")
    keys = _keyfile(reconcile, KEY)
    g = gateway("--api-keys", str(keys))
    g.wait_phase("alpha", "Ready")
    try:
        with Load(g.port, "alpha", 12, {"x-api-key": KEY}) as load:
            for i in range(12):
                old = g.serving()
                load.more(reconcile, 8, f"answers before hand-over {i + 1}")
                hand_over(reconcile, old)
                reconcile.wait_for(
                    lambda old=old: not old.alive(), timeout=WAIT, what=f"old gateway {i}"
                )
            load.more(reconcile, 8, "answers after the last hand-over")
        load.check()
    finally:
        g.finish()


def test_gateway_crash_restarted_stop_is_no_crash_sigterm_leaves_it(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    first = g.serving()
    os.kill(first.ref.pid, signal.SIGKILL)
    reconcile.wait_for(
        lambda: (i := g.serving_or_none()) is not None and i.ref != first.ref,
        timeout=WAIT,
        what="the gateway restarted",
    )
    assert said(g, "gateway exited unexpectedly") == 1
    assert g.post("alpha").status == 200
    # A deliberate stop is no crash: it stays stopped...
    stopped = reconcile("gateway", "stop", check=0)
    assert "stopped gateway pid" in stopped.out, stopped
    reconcile.wait_for(lambda: said(g, "gateway stopped (not a crash)"), timeout=WAIT, what="seen")
    assert g.serving_or_none() is None and gateway_pids(reconcile) == set()
    # ... until SIGHUP asks for it again.
    g.proc.send_signal(signal.SIGHUP)
    reconcile.wait_for(g.serving_or_none, timeout=WAIT, what="the gateway started on SIGHUP")
    assert g.post("alpha").status == 200
    # SIGTERM of the daemon stops the daemon alone: the gateway serves on.
    assert g.stop() == 0
    assert g.post("alpha").status == 200
    assert reconcile("gateway", check=0).code == 0
    reconcile.down("--gateway")
    assert gateway_pids(reconcile) == set()


def test_counters_run_on_across_a_hand_over(reconcile: Any, gateway: Any) -> None:
    """The old gateway's requests, those it drained after the hand-over included, stay
    in the successor's counters: /metrics never goes back (no reset for rate())."""
    from prometheus_client.parser import text_string_to_metric_families

    from controller.store.config import accesstoken

    streaming(reconcile, "alpha")
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("alpha", "Ready")
    url = f"http://127.0.0.1:{port}/metrics?token={accesstoken.read(reconcile.state)}"

    def requests() -> float:
        with urllib.request.urlopen(url, timeout=WAIT) as answer:
            text = answer.read().decode()
        families = text_string_to_metric_families(text)
        return sum(
            s.value
            for f in families
            for s in f.samples
            if s.name == "reconcile_gateway_requests_total" and s.labels["deployment"] == "alpha"
        )

    try:
        old = g.serving()
        # what a successor that died before reading it left: swept by the next one
        (reconcile.state / "gateway" / "handed-0dead.prom").write_text("# nothing\n")
        with Load(g.port, "alpha", 4) as load:
            load.more(reconcile, 8, "answers from the first gateway")
            hand_over(reconcile, old)
            reconcile.wait_for(lambda: not old.alive(), timeout=WAIT, what="the old gateway gone")
            load.more(reconcile, 8, "answers from the new gateway")
        load.check()
        served = load.ok
        reconcile.wait_for(lambda: requests() == served, timeout=WAIT, what=f"{served} counted")
        handed = reconcile.state / "gateway"  # the old one's file taken, the dead one's swept
        reconcile.wait_for(lambda: not list(handed.glob("handed-*")), what="no handed-* left")
    finally:
        g.finish()


def test_counters_run_on_across_two_hand_overs_while_the_oldest_drains(
    reconcile: Any, gateway: Any
) -> None:
    """Two hand-overs in a row (A -> B -> C) while A still drains a stream: B hands down
    before A is done, so C waits for A's final counters too. C ends with every request
    (A's 3 and the stream it finished after both hand-overs, B's, C's), and no
    ``handed-*.prom`` is left behind (A's once was, and its counts were lost)."""
    hold = reconcile.tmp / "hold"  # while it exists, the stream's end waits
    hold.touch()
    echo = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
    reconcile.write("slowr", command=[*echo, "--hold-while", str(hold)])
    port = reconcile.port + 14
    g = gateway("--metrics-port", str(port))
    g.wait_phase("slowr", "Ready")
    url = f"http://127.0.0.1:{port}/metrics?token={accesstoken.read(reconcile.state)}"
    try:
        first = g.serving()
        for _ in range(3):
            assert g.post("slowr").status == 200
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=WAIT)
        try:
            stream = stream_begun(conn, "slowr")  # held by the first gateway
            hand_over(reconcile, first)
            second = g.serving()
            assert g.post("slowr").status == 200
            hand_over(reconcile, second)
            assert g.post("slowr").status == 200
            # The second has handed down (nothing held it); the first drains on.
            reconcile.wait_for(lambda: not second.alive(), timeout=WAIT, what="second gone")
            assert first.alive(), "the first gateway drains the stream still"
            hold.unlink()  # the stream ends: the first gateway counts it, then exits
            assert b"data: [DONE]" in stream.read()
        finally:
            conn.close()
        reconcile.wait_for(lambda: not first.alive(), timeout=WAIT, what="the first gone")
        made = 3 + 1 + 1 + 1  # the first's, the second's, the third's, the stream
        counted = lambda: _requests(url, "slowr") == made  # noqa: E731
        reconcile.wait_for(counted, timeout=WAIT, what=f"{made} requests counted")
        handed = reconcile.state / "gateway"
        reconcile.wait_for(lambda: not list(handed.glob("handed-*")), what="no handed-* left")
    finally:
        g.finish()


def _requests(url: str, deployment: str) -> float:
    """``reconcile_gateway_requests_total`` of ``deployment`` at the daemon's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=WAIT) as answer:
        text = answer.read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "reconcile_gateway_requests_total" and s.labels["deployment"] == deployment
    )
