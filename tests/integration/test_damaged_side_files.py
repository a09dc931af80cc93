"""Side documents damaged under running engines (a disk that lied, a hand edit): what
they held is taken from what is left, never read as a choice to stop an engine.

The activation is written through the store as the gateway writes it (a request through
a gateway is tests/gateway's); everything else is the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

from procs import wait_for

from controller.core.state import Activation
from controller.failpoints import ENV as FAILPOINTS
from controller.host import bootclock
from controller.store.side import activation

# A CLI call's bound, as tests/conftest.py's CLI_TIMEOUT (not imported: `conftest` is
# whichever folder's conftest was imported last when several folders run together).
CLI_BOUND = 60.0


def test_a_torn_activation_keeps_its_engine_as_of_the_files_last_write(reconcile: Any) -> None:
    """Torn and quarantined, it counted as no demand: the pass parked the Ready engine at
    once (`idle: no request for 3600s`), a request in flight a second before. It is a
    request at the file's mtime now (the gateway writes it at each request)."""
    reconcile.write("od", activation="OnDemand", idleTimeout=3600)
    activation.write(reconcile.state, "od", Activation(datetime.now(UTC), inflight=1))
    reconcile.converge()
    pid = reconcile.record("od")["ref"]["pid"]
    torn = reconcile.state / "activation" / "od.json"
    torn.write_text('{"last_request_at": "2026-')
    written = os.stat(torn).st_mtime
    out = reconcile.once()
    assert "state file quarantined" in out.err and "park" not in out.err, out
    assert reconcile.record("od")["ref"]["pid"] == pid and reconcile.alive(pid)
    kept = json.loads(torn.read_text())  # written back: the next pass reads it whole
    at = datetime.fromisoformat(kept["last_request_at"]).timestamp()
    assert abs(at - written) < 1.0, (kept, written)
    reconcile.once()
    assert reconcile.record("od")["ref"]["pid"] == pid
    reconcile.down()


def _frozen(pid: int) -> bool:
    """The process is stopped (SIGSTOP: a failpoint's ``stop``), ``T`` in /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


def _pass_held_while_the_gateway_writes(reconcile: Any) -> tuple[Activation, str]:
    """``od``'s activation torn an hour ago; a pass (``--once``) held at its write-back (a
    failpoint's stop) while the gateway writes a request in flight, then let go. The
    request written, and the pass's log."""
    torn = reconcile.state / "activation" / "od.json"
    torn.parent.mkdir(mode=0o700, exist_ok=True)  # no request yet: no folder
    torn.write_text('{"last_request_at": "2026-')
    hour_ago = time.time() - 3600
    os.utime(torn, (hour_ago, hour_ago))
    log = reconcile.tmp / "held-pass.log"
    with open(log, "wb") as err:
        env = {**reconcile.env, FAILPOINTS: "activation.write_back.before=stop"}
        held = reconcile.daemon("--once", env=env, stderr=err)
        wait_for(lambda: _frozen(held.pid), CLI_BOUND, "the pass held at its write-back")
        assert not torn.exists()  # set aside: the gateway's write makes a new file
        request = Activation(datetime.now(UTC), inflight=1, boot=bootclock.read())
        activation.write(reconcile.state, "od", request)  # as the gateway writes it
        held.send_signal(signal.SIGCONT)
        code = held.wait(timeout=CLI_BOUND)
    out = log.read_text()
    assert code == 0 and "state file quarantined" in out, out
    return request, out


def test_a_request_written_while_a_pass_writes_a_torn_activation_back_is_kept(
    reconcile: Any,
) -> None:
    """The pass sets the torn file aside, then writes back a request at its mtime (an hour
    ago here). A request the gateway wrote between the two (in flight, now) was replaced
    by that hour-old one, and the same pass parked the Ready engine under it. The
    write-back lands only where no file is now, so the request's write is what the pass
    reads."""
    reconcile.write("od", activation="OnDemand", idleTimeout=60)
    activation.write(reconcile.state, "od", Activation(datetime.now(UTC), inflight=1))
    reconcile.converge()
    pid = reconcile.record("od")["ref"]["pid"]
    request, out = _pass_held_while_the_gateway_writes(reconcile)
    assert "park" not in out, out
    assert reconcile.record("od")["ref"]["pid"] == pid and reconcile.alive(pid)
    assert activation.read_all(reconcile.state, peek=True)["od"] == request
    reconcile.down()


def test_a_request_that_wakes_a_parked_engine_beside_a_torn_activation_wakes_it(
    reconcile: Any,
) -> None:
    """The same race from the other side: the engine parked, the gateway's request to wake
    it (written, then a pass asked for) was replaced by the hour-old write-back, and the
    pass it asked for started nothing. That pass starts the engine now."""
    reconcile.write("od", activation="OnDemand", idleTimeout=60)
    reconcile.once()
    assert reconcile.record("od") is None or reconcile.record("od")["phase"] == "Idle"
    request, out = _pass_held_while_the_gateway_writes(reconcile)
    assert '"action": "start"' in out, out
    assert activation.read_all(reconcile.state, peek=True)["od"] == request
    reconcile.down()
