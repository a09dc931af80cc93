"""A pass judges an OnDemand engine's idleTimeout on the demand as it is when it plans,
not as it was when the pass read its manifests: the round's probes can take seconds on a
loaded host, and the gateway's heartbeat written meanwhile kept the engine wanted.

Before, a pass whose probe of a Starting engine outlasted its idleTimeout parked the
engine a request was still waiting for (the gateway's heartbeat fresh on disk): seen as a
second start in tests/gateway/test_clock_idle.py at load 20.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.core.state import Activation
from controller.host import bootclock
from controller.store.side import activation

IDLE = 3.0  # seconds: the idleTimeout (a completion probe waits 5 s for its answer)

# An engine still loading whose completion answers 503 only once the demand on disk when
# the probe came has run out its idleTimeout: the probe outlasts the demand the pass read.
ENGINE = r"""
import http.server, sys, time
from pathlib import Path
from controller.host import bootclock
from controller.store.side import activation

port, state, idle = int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])

class Health(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        seen = activation.read_all(state)["lazy"].boot.seconds
        deadline = time.monotonic() + 60
        while bootclock.read().seconds <= seen + idle and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(state.parent / "outlasted", "a") as said:  # the test's proof it was probed
            said.write(f"{seen}\n")
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def heartbeat(reconcile: Any) -> Iterator[None]:
    """The gateway's side: a request in flight for lazy, its demand refreshed every 0.1 s."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            now = Activation(last_request_at=datetime.now(UTC), inflight=1, boot=bootclock.read())
            activation.write(reconcile.state, "lazy", now)
            stop.wait(0.1)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=10)


def test_a_probe_longer_than_the_idle_timeout_parks_no_engine_a_request_waits_for(
    reconcile: Any, heartbeat: None, tmp_path: Path
) -> None:
    script = tmp_path / "loading.py"
    script.write_text(ENGINE)
    reconcile.write(
        "lazy",
        command=[sys.executable, str(script), "{port}", str(reconcile.state), f"{IDLE:g}"],
        activation="OnDemand",
        idleTimeout=f"{IDLE:g}s",
        readiness={"completion": {}, "deadlineSeconds": 300, "periodSeconds": 0.2},
    )
    reconcile.once()  # started (and maybe probed, if it listened in time)
    port = reconcile.record("lazy")["port"]
    reconcile.wait_for(lambda: _listens(port), timeout=60, what="the engine listening")
    outlasted = reconcile.state.parent / "outlasted"
    outlasted.unlink(missing_ok=True)  # pass 1 may have probed it too
    reconcile.once()  # its probe takes longer than the idleTimeout
    assert outlasted.exists()  # it did
    rec = reconcile.record("lazy")
    assert rec is not None and rec["phase"] == "Starting", rec
    assert reconcile.pids("lazy"), rec
    parks = [e for e in reconcile.events("lazy") if e.get("action") == "park"]
    assert not parks, parks
    reconcile.down()
    assert not reconcile.pids("lazy")


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
