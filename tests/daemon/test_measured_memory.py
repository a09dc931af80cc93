"""Measured memory through a real daemon and engine, NVML injected (the fake source:
``RECONCILE_FAKE_NVML``): ``devices.memory: auto`` first leases the whole device, the
engine's measured GPU memory is recorded per spec hash, ``describe`` shows requested
beside measured, the restart leases the measurement + 10% (room beside it packs), and
`plan` says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GI = 1 << 30
AUTO = {"devices": {"count": 1, "kind": "nvidia", "memory": "auto"}}


def peaks(reconcile: Any) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(
            (reconcile.state / "devices" / "measured.json").read_text()
        )
    except FileNotFoundError:
        return {}
    return found


def test_memory_auto_leases_the_measured_peak_plus_ten_percent_after_a_restart(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    fake: Path = reconcile.tmp / "nvml.jsonl"
    reconcile.env["RECONCILE_FAKE_NVML"] = str(fake)
    reconcile.write("web", **AUTO)
    d = daemon(resync="0.5")
    first = d.wait(lambda: _ready(reconcile, "web"), "web Ready")
    record = reconcile.record("web")
    assert record is not None and record["memory"] is None  # not measured: the whole device
    assert "not measured" in reconcile("describe", "web", check=0).out

    fake.write_text(json.dumps({"pid": first["pid"], "used": 20 * GI}) + "\n")
    seen = d.wait(lambda: peaks(reconcile).get(record["spec_hash"]), "the measurement")
    assert seen["peak"] == 20 * GI and seen["name"] == "web"
    text = reconcile("describe", "web", check=0).out
    assert "requested whole device (memory: auto); measured peak 20Gi per device" in text, text

    reconcile("restart", "web", "--no-wait", check=0)
    again = d.wait(
        lambda: (s := _ready(reconcile, "web")) and s["pid"] != first["pid"] and s,
        "the restarted web Ready",
    )
    record = reconcile.record("web")
    assert record is not None and record["memory"] == 22 * GI, record
    assert "requested 22Gi per device (memory: auto)" in reconcile("describe", "web").out
    # The lease is real: a 50Gi request packs beside it on the same device.
    reconcile.write("side", devices={"count": 1, "kind": "nvidia", "memory": "50Gi"})
    side = d.wait(lambda: _ready(reconcile, "side"), "side Ready")
    assert side["devices"] == again["devices"]
    finish(d)
    # What a start would lease now, as `plan` says it (the measurement outlives the engine).
    (reconcile.manifests / "side.yaml").unlink()
    shown = reconcile("plan").out
    assert "memory auto: measured 20Gi + 10% = 22Gi" in shown, shown


def _ready(reconcile: Any, name: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = reconcile.status(name).get(name)
    return item if item is not None and item["phase"] == "Ready" else None
