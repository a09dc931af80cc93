"""The planner and a backend that places engines itself (Ray): ``Resync``, pure.

The planner never learns where a process runs: it compares the record with the
``Instance`` the backend reports, as opaque values, and a difference is a Resync.
"""

from __future__ import annotations

from typing import Any

import pytest
from strategies import NOW, desired, entry, observed, record, ref, view

from controller.core.actions import MarkReady, Resync
from controller.core.devices.inventory import Inventory
from controller.core.plan import plan
from controller.core.state import Instance, Phase, ProbeResult

WEB = entry("web")
HERE = {"node": "n" * 56, "host": "10.0.0.1", "port": 8000, "devices": ("nvidia:nnnnnnnn/0",)}


def where(**fields: Any) -> Instance:
    values: dict[str, Any] = {**HERE, "ref": ref(100), **fields}
    return Instance(**values)


def resyncs(instance: Instance | None, **rec: Any) -> list[Resync]:
    fields = {**HERE, "backend": "ray", **rec}
    seen = observed(view(record("web", spec=WEB, **fields), alive=True, instance=instance))
    return [a for a in plan(desired(WEB), seen, Inventory(), NOW) if isinstance(a, Resync)]


@pytest.mark.parametrize(
    ("instance", "restarted", "phrase"),
    [
        (where(node="m" * 56, host="10.0.0.2", ref=ref(7)), True, "moved it to node mmmm"),
        (where(ref=ref(7)), True, "restarted the engine (pid 7)"),
        (where(ref=None, message="Ray is restarting its actor"), False, "restarting its actor"),
        (where(port=8001), False, "runs at 10.0.0.1:8001"),
    ],
    ids=["node-lost-moved", "engine-restarted-by-actor", "actor-restarting", "port-moved"],
)
def test_a_difference_is_a_resync(instance: Instance, restarted: bool, phrase: str) -> None:
    (action,) = resyncs(instance)
    assert action.restarted is restarted and phrase in action.reason
    assert action.instance == instance


def test_the_same_place_is_no_resync() -> None:
    assert resyncs(where()) == []
    assert resyncs(None) == []  # the local backend reports nothing


def test_restarting_is_said_once() -> None:
    still = where(ref=None, message="Ray is restarting its actor")
    assert resyncs(still, phase=Phase.STARTING, message=still.message) == []


def test_a_resynced_engine_is_probed_to_ready() -> None:
    rec = record("web", spec=WEB, backend="ray", phase=Phase.STARTING, **HERE)
    ok = ProbeResult(ready=True, detail="GET /health -> 2xx")
    seen = observed(view(rec, alive=True, instance=where(), probe=ok))
    assert [type(a) for a in plan(desired(WEB), seen, Inventory(), NOW)] == [MarkReady]
