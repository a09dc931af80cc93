"""The gateway under test: the real daemon with ``--listen``, real engines, real sockets.

``gateway(...)`` starts ``reconcile --listen`` on the test's node (a port from its
block) and waits for ``/healthz``; the daemon starts (or adopts) the gateway process,
which outlives it. Tests end with ``g.finish()``: SIGTERM the daemon, then
``reconcile down --gateway`` (engines and the gateway process). Teardown SIGKILLs any
daemon still running, then every gateway process of the node (marked
``RECONCILE_GATEWAY=<node>/...``), then the ``reconcile`` fixture sweeps the engines.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import warmcli
from procs import GATEWAY_MARKER, free_ports, kill_marked, marked_pids

from controller.gateway.lifecycle import registry
from controller.gateway.lifecycle.app import Gateway as InProcess
from controller.gateway.settings import Settings

if TYPE_CHECKING:
    from clients import Held  # tests/gateway's own module: imported where a test uses it

WAIT = 30.0


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:300]!r})"


class Gateway:
    def __init__(
        self, rc: Any, proc: subprocess.Popen[bytes] | warmcli.Started, log: Path, port: int
    ) -> None:
        self.rc = rc
        self.proc = proc
        self.log = log
        self.port = port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = WAIT,
    ) -> Answer:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers or {})
            resp = conn.getresponse()
            return Answer(resp.status, dict(resp.getheaders()), resp.read())
        finally:
            conn.close()

    def post(self, model: str, headers: dict[str, str] | None = None, **extra: Any) -> Answer:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
        return self.request("POST", "/v1/chat/completions", body, headers)

    def text(self) -> str:
        return self.log.read_text()

    def wait_phase(self, name: str, phase: str, timeout: float = WAIT) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"daemon exited {self.proc.returncode}:\n{self.text()[-3000:]}"
                )
            item = self.rc.status(name).get(name)
            return item if item and item["phase"] == phase else None

        try:
            result: dict[str, Any] = self.rc.wait_for(
                found, timeout=timeout, what=f"{name} {phase}"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.rc.status()}\n{self.text()[-3000:]}") from None
        return result

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=WAIT)

    def finish(self) -> None:
        code = self.stop()
        assert code == 0, f"daemon exited {code}:\n{self.text()[-3000:]}"
        try:
            self.rc.down("--gateway")
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "reconcile down --gateway did not end in time; the gateway's threads "
                f"(SIGABRT, faulthandler):\n{self.threads_of_gateways()}"
            ) from None
        assert gateway_pids(self.rc) == set(), "reconcile down --gateway left a gateway"

    def threads_of_gateways(self) -> str:
        """Abort the node's gateway processes: faulthandler (``PYTHONFAULTHANDLER``, set
        for every daemon these tests start) writes each thread's stack to the log they
        share with the daemon, which this returns the end of. A hung stop is found from
        its stacks, not guessed at."""
        for pid in gateway_pids(self.rc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        time.sleep(1.0)
        return self.text()[-8000:]

    def serving(self) -> registry.GatewayInfo:
        """The gateway process that holds the port now."""
        info = self.serving_or_none()
        assert info is not None, f"no live gateway:\n{self.text()[-3000:]}"
        return info

    def serving_or_none(self) -> registry.GatewayInfo | None:
        return registry.current_live(self.rc.state)


class Gateways:
    def __init__(self, rc: Any) -> None:
        self.rc = rc
        self.started: list[Gateway] = []

    def __call__(
        self,
        *args: str,
        port: int | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        resync: str | None = "1h",
    ) -> Gateway:
        """``prefix``: a wrapper that execs the daemon (``prlimit --nofile=256``);
        ``resync``: the daemon's ``--resync`` (None: its default, a pass every 5 s)."""
        port = port or self.rc.port + 15
        log = self.rc.tmp / f"daemon-{len(self.started)}.log"
        listen = [] if any(a.startswith("--listen") for a in args) else ["--listen", str(port)]
        flags = ["-v", *(["--resync", resync] if resync else []), *listen, *args]
        # faulthandler in the daemon and its gateway: Gateway.threads_of_gateways.
        env = {**self.rc.env, "PYTHONFAULTHANDLER": "1", **(env or {})}
        with open(log, "wb") as err:
            if prefix:
                proc = self.rc.spawn([*prefix, *self.rc.argv(*flags)], stderr=err, env=env)
            else:
                proc = self.rc.daemon(*flags, stderr=err, env=env)
        g = Gateway(self.rc, proc, log, port)
        self.started.append(g)
        if wait:
            try:
                self.rc.wait_for(lambda: _up(g), timeout=WAIT, what="gateway /healthz")
            except AssertionError as exc:  # the daemon's log says which start was slow
                if g.proc.poll() is not None:
                    raise  # _up said the daemon's exit, with its log
                raise AssertionError(f"{exc}; the daemon's log ends:\n{g.text()[-3000:]}") from None
        return g

    def kill_all(self) -> None:
        for g in self.started:
            if g.proc.poll() is None:
                g.proc.kill()
                g.proc.wait(timeout=WAIT)
        # Daemons first (one would restart its gateway), then what outlives them.
        kill_marked(f"{self.rc.node}/", marker=GATEWAY_MARKER)


def gateway_pids(rc: Any) -> set[int]:
    """Live gateway processes of the test's node."""
    return marked_pids(f"{rc.node}/", GATEWAY_MARKER)


def _up(g: Gateway) -> bool:
    if g.proc.poll() is not None:
        raise AssertionError(f"daemon exited {g.proc.returncode}:\n{g.text()[-3000:]}")
    try:
        return g.request("GET", "/healthz", timeout=2).status == 200
    except OSError:
        return False


@pytest.fixture
def gateway(reconcile: Any) -> Iterator[Gateways]:
    gateways = Gateways(reconcile)
    yield gateways
    gateways.kill_all()


@pytest.fixture
def held(reconcile: Any) -> Iterator[Held]:
    """Streams held until released (clients.Held); released at teardown too, so a test
    that failed first leaves no drain waiting on them. Imported here, not at the top:
    tests/ui's conftest imports this one, and tests/ui run alone has no `clients`."""
    from clients import Held

    hold = Held(reconcile.tmp)
    yield hold
    hold.release()


@pytest.fixture
def inproc(reconcile: Any) -> Iterator[InProcess]:
    """A gateway in this process (no daemon): its table is the test's to fill."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    settings = Settings(host="127.0.0.1", port=free_ports(1), state_dir=reconcile.state)
    gateway = InProcess(settings)
    gateway.start(lambda: None)
    yield gateway
    gateway.stop()
