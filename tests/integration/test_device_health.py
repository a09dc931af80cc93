"""GPU health through the real CLI and real engine processes, NVML injected: the fake
source (``RECONCILE_FAKE_NVML``, host/gpuhealth.py) reports an Xid 79 on ``nvidia:1``;
the pass moves its engine to the healthy device, ``devices`` names the fault, and
``devices --clear`` returns the device."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MEM = {"devices": {"count": 1, "kind": "nvidia", "memory": "10Gi"}}


def fake_nvml(reconcile: Any) -> Path:
    fake: Path = reconcile.tmp / "nvml.jsonl"
    reconcile.env["RECONCILE_FAKE_NVML"] = str(fake)
    return fake


def report(fake: Path, **fact: Any) -> None:
    with fake.open("a") as out:
        out.write(json.dumps(fact) + "\n")


def device_json(reconcile: Any) -> dict[str, dict[str, Any]]:
    doc = reconcile("devices", "-o", "json", check=0).json()
    return {d["device"]: d for d in doc["devices"]}


def test_an_xid_79_moves_the_engine_to_a_healthy_device_and_clear_returns_it(
    reconcile: Any,
) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    fake = fake_nvml(reconcile)
    reconcile.write("web", replicas=2, **MEM)  # replicas spread: web@1 on nvidia:1
    reconcile.converge()
    moved = reconcile.status()["web@1"]
    assert moved["devices"] == ["nvidia:1"], reconcile.status()
    stays = reconcile.status()["web"]["pid"]

    report(fake, device="nvidia:1", xid=79, time=datetime.now(UTC).isoformat())
    reconcile.converge()
    now = reconcile.status()
    assert now["web@1"]["devices"] == ["nvidia:0"] and now["web@1"]["phase"] == "Ready", now
    assert now["web@1"]["pid"] != moved["pid"] and not reconcile.alive(moved["pid"])
    assert now["web"]["pid"] == stays  # on the healthy device: untouched
    steps = [e for e in reconcile.events("web") if e.get("instance") == "web@1"]
    replaced = [e for e in steps if e["action"] == "replace"]
    assert len(replaced) == 1 and "device nvidia:1 Unhealthy since" in replaced[0]["reason"]
    assert "Xid 79 (GPU has fallen off the bus)" in replaced[0]["reason"]
    after = steps[steps.index(replaced[0]) + 1 :]
    assert [e["action"] for e in after] == ["start", "ready"], steps
    assert "nvidia:0" in after[0]["reason"], after

    text = reconcile("devices", check=0).out
    assert "Unhealthy" in text and "Xid 79 (GPU has fallen off the bus)" in text, text
    assert "reconcile devices --clear nvidia:1" in text, text
    sick = device_json(reconcile)["nvidia:1"]
    assert sick["health"] == "Unhealthy" and sick["health_reason"].startswith("Xid 79"), sick
    assert sick["unhealthy_since"] and device_json(reconcile)["nvidia:0"]["health"] == "Healthy"

    # Nothing new is placed there while it is Unhealthy...
    reconcile.write("whole", devices={"count": 1, "kind": "nvidia"})
    reconcile.once(check=1)  # Pending: no whole device is free
    assert "Unhealthy (Xid 79" in reconcile.status()["whole"]["message"]
    # ... and --clear returns it: the Pending deployment starts there.
    cleared = reconcile("devices", "--clear", "nvidia:1", check=0)
    assert "nvidia:1 cleared" in cleared.out and "Xid 79" in cleared.out, cleared
    assert device_json(reconcile)["nvidia:1"]["health"] == "Healthy"
    reconcile.converge()  # the Xid line is still in the file: from before the clear
    assert reconcile.status()["whole"]["devices"] == ["nvidia:1"]
    # A usage error, said on stderr as every other (it was printed to stdout, bare)
    unknown = reconcile("devices", "--clear", "nvidia:7", check=64)
    assert unknown.out == "" and unknown.err.startswith("reconcile: no device nvidia:7"), unknown
    assert "(its devices: nvidia:0, nvidia:1)" in unknown.err, unknown
    reconcile.down()


def test_a_rise_of_uncorrectable_ecc_errors_makes_a_device_unhealthy(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    fake = fake_nvml(reconcile)
    report(fake, device="nvidia:0", ecc_uncorrected=2)  # the first reading: the base
    reconcile.write("web", devices={"count": 1, "kind": "nvidia"})
    reconcile.converge()
    assert reconcile.status()["web"]["devices"] == ["nvidia:0"]
    report(fake, device="nvidia:0", ecc_uncorrected=3)
    reconcile.converge()
    assert reconcile.status()["web"]["devices"] == ["nvidia:1"]
    reason = device_json(reconcile)["nvidia:0"]["health_reason"]
    assert reason == "uncorrectable ECC errors rose from 2 to 3", reason
    reconcile.down()
