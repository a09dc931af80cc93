"""A downgrade: the gateway of a reconcile older than the one that wrote a record.

The record is kept as the newer reconcile would leave it: today's, saying a version this
reconcile has no reader for. Its engine runs on (the older reconcile neither stops nor
forgets it); a gateway that never read it before (a hand-over's successor) cannot route
to it.
"""

from __future__ import annotations

import json
from typing import Any

from controller.store.documents import write_atomic

WAIT = 60.0


def test_a_deployment_whose_record_a_newer_reconcile_wrote_is_503_not_404(
    reconcile: Any, gateway: Any
) -> None:
    """Downgraded, every request for such a deployment was a 404 `model_not_found` ("does
    not exist"): a client took the model for gone. It is a 503 with Retry-After now,
    saying why; once the newer reconcile's record is readable again it is served."""
    reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    path = reconcile.record_path("web")
    today = path.read_text()
    # Renamed into place, as any reconcile writes a record: written in place, a pass still
    # in flight (the one that said Ready) read it empty, quarantined it and adopted the
    # engine under a record of today's version, which the new gateway served (a 200).
    write_atomic(path, json.dumps({**json.loads(today), "version": 99}).encode())
    reconcile("gateway", "restart", check=0)  # a gateway with no last good reading of it

    answer = g.post("web")
    assert answer.status == 503 and answer.headers.get("Retry-After"), answer
    message = answer.json()["error"]["message"]
    assert "record a newer reconcile wrote" in message and "retry later" in message, message
    assert g.post("nothing").status == 404  # a name no record holds still does not exist

    write_atomic(path, today.encode())  # the newer reconcile runs the node again
    reconcile.wait_for(lambda: g.post("web").status == 200, timeout=WAIT, what="web served")
    g.finish()
