"""``devices.memory: auto`` (core/planner/ledger.py): whole devices until the engine was
measured, then its peak + 10%; the spec says auto in its document and hash either way;
a spec with a request of its own shows requested beside measured; what an engine uses is
its processes summed, per device."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from strategies import NOW, desired, entry, marked, observed, record, ref, view

from controller.core.actions import Start
from controller.core.devicefaults import Measured
from controller.core.devices.inventory import Device, Inventory
from controller.core.manifest.specs import Devices, Entry, spec_document, spec_hash
from controller.core.plan import plan
from controller.core.planner.ledger import resolve, with_headroom
from controller.reconciler.gpuwatch import engine_peaks

GI = 1 << 30
AUTO = {"devices": {"count": 1, "kind": "nvidia", "memory": "auto"}}
SIZED = Inventory(tuple(Device(kind="nvidia", id=i, memory=80 * GI) for i in "01"))


def peak(e: Entry, size: int) -> dict[str, Measured]:
    return {e.hash: Measured(size, datetime(2026, 1, 1, tzinfo=UTC), "web")}


def test_auto_is_a_whole_device_until_measured_then_the_peak_plus_ten_percent() -> None:
    web = entry("web", **AUTO)
    same, note = resolve(web, {})
    assert same is web and same.deployment.spec.devices.memory is None
    assert "not measured yet, whole devices" in note
    sized, note = resolve(web, peak(web, 20 * GI))
    assert sized.deployment.spec.devices.memory == 22 * GI and sized.hash == web.hash
    assert note == " (memory auto: measured 20Gi + 10% = 22Gi)"
    assert spec_document(sized.deployment.spec)["devices"]["memory"] == "auto"
    assert spec_hash(sized.deployment.spec) == web.hash  # resolving restarts nothing


@pytest.mark.parametrize(("size", "lease"), [(10, 11), (1, 2), (0, 0), (100 * GI, 110 * GI)])
def test_the_headroom_is_rounded_up(size: int, lease: int) -> None:
    assert with_headroom(size) == lease


def test_the_plan_leases_the_measurement_and_packs_beside_it() -> None:
    web = entry("web", **AUTO)
    (whole,) = plan(desired(web), observed(), SIZED, NOW)
    assert isinstance(whole, Start) and "not measured yet" in whole.reason
    assert whole.entry.deployment.spec.devices.memory is None  # the whole device
    (start,) = plan(desired(web), observed(measured=peak(web, 30 * GI)), SIZED, NOW)
    assert isinstance(start, Start) and start.entry.deployment.spec.devices.memory == 33 * GI
    assert "measured 30Gi + 10% = 33Gi" in start.reason and start.devices == ("nvidia:0",)


def test_a_fixed_request_shows_what_was_measured_and_keeps_its_own() -> None:
    fixed = entry("web", devices={"count": 1, "kind": "nvidia", "memory": "40Gi"})
    same, note = resolve(fixed, peak(fixed, 12 * GI))
    assert same is fixed and note == " (memory 40Gi requested, measured 12Gi)"


def test_auto_needs_devices_and_other_words_are_refused() -> None:
    assert Devices.model_validate({"count": 1, "memory": "auto"}).memory_auto
    assert not Devices.model_validate({"count": 1, "memory": "20Gi"}).memory_auto
    with pytest.raises(ValueError, match=r"devices\.count is 0"):
        Devices.model_validate({"count": 0, "memory": "auto"})
    with pytest.raises(ValueError, match="not a quantity"):
        Devices.model_validate({"count": 1, "memory": "automatic"})


def test_an_engines_use_is_its_processes_summed_per_device_and_dead_ones_count_nothing() -> None:
    web = entry("web", devices={"count": 2, "kind": "nvidia"})
    two = record("web", spec=web, devices=("nvidia:0", "nvidia:1"), port=8000, ref=ref(10))
    gone = record("old", devices=("nvidia:0",), port=8001, ref=ref(20), spec_hash="h-old")
    seen = observed(
        view(two, alive=True, markers=(marked(11, "web", "n"), marked(12, "web", "n"))),
        view(gone, alive=False),
    )
    used = {10: 2 * GI, 11: 3 * GI, 12: 1 * GI + 1, 20: 9 * GI, 99: 50 * GI}
    peaks = engine_peaks(seen, used, None)
    assert list(peaks) == [web.hash] and peaks[web.hash].name == "web"
    assert peaks[web.hash].peak == 3 * GI + 1  # 6Gi + 1 over 2 devices, rounded up
