"""Side documents damaged under running engines (a disk that lied, a hand edit): what
they held is taken from what is left, never read as a choice to stop an engine.

The activation is written through the store as the gateway writes it (a request through
a gateway is tests/gateway's); everything else is the real CLI.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from controller.core.state import Activation
from controller.store.side import activation


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
