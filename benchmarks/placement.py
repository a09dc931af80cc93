"""7. Placement: the pure planner packing deployments with random memory requests.

Same inputs for every strategy in one run (a seeded generator): N deployments, each
asking 1-12 GiB on one NVIDIA device, on 64 devices of 80 GiB (demand ~1.3x the
capacity, so the packing decides who fits).

* plan time: ``plan()`` from scratch at N, 10N, 100N; linear means 10x the
  deployments costs at most 12x the time.
* packing: deployments placed by our best fit vs first fit (same order) vs the best
  of 100 random orders (our fit, shuffled input order).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from benchmarks.common import Row, median
from controller.core.devices.inventory import Device, Inventory
from controller.core.devices.placement import Ledger, _device_order, place_devices
from controller.core.manifest.specs import Deployment, Entry, spec_hash
from controller.core.plan import Desired, plan
from controller.core.state import Observed

SECTION = "7. placement"
GI = 1 << 30
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def inventory(devices: int) -> Inventory:
    return Inventory(
        tuple(Device(kind="nvidia", id=str(i), memory=80 * GI) for i in range(devices)),
        source="static",
    )


def entries(n: int, seed: int, whole_every: int = 0) -> list[Entry]:
    """N deployments; with ``whole_every`` k, every k-th leases a whole device instead."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        devices: dict[str, object] = {"count": 1, "kind": "nvidia"}
        if not whole_every or i % whole_every:
            devices["memory"] = rng.randint(1, 12) * GI
        doc = {
            "apiVersion": "reconcile/v1",
            "kind": "Deployment",
            "metadata": {"name": f"d{i:05d}"},
            "spec": {
                "engine": "command",
                "command": ["serve", "{port}"],
                "devices": devices,
                "basePort": 20000,
            },
        }
        dep = Deployment.model_validate(doc)
        out.append(Entry(dep, "bench.yaml", 1, spec_hash(dep.spec)))
    return out


def plan_seconds(es: Sequence[Entry], inv: Inventory, trials: int) -> tuple[float, int]:
    desired = Desired(owner="bench", entries={e.name: e for e in es})
    times, started = [], 0
    for _ in range(trials):
        t = time.perf_counter()
        actions = plan(desired, Observed(), inv, NOW)
        times.append(time.perf_counter() - t)
        started = sum(1 for a in actions if a.verb == "start")
    return median(times), started


def placed_by(es: Sequence[Entry], inv: Inventory, first_fit: bool) -> int:
    """How many fit, placing in the given order; first fit is the naive alternative."""
    ledger, count = Ledger(), 0
    devices = sorted(inv.devices, key=_device_order)
    for e in es:
        want = e.deployment.spec.devices.memory
        if first_fit:
            chosen = next((d.key for d in devices if _free(ledger, d, want)), None)
            keys: tuple[str, ...] | None = (chosen,) if chosen else None
        else:
            got = place_devices(e.deployment.spec, inv, ledger)
            keys = got if isinstance(got, tuple) else None
        if keys:
            ledger.take(e.name, keys, (), False, want)
            count += 1
    return count


def _free(ledger: Ledger, device: Device, want: int | None) -> bool:
    return ledger.free_for(device.key, False) if want is None else ledger.fits(device, want)


def bench(n: int, devices: int = 64, trials: int = 5, orders: int = 100) -> list[Row]:
    inv = inventory(devices)
    sizes = [n // 10, n, n * 10]
    timed = {size: plan_seconds(entries(size, seed=size), inv, trials) for size in sizes}
    es = entries(n, seed=n)
    ours, first = placed_by(es, inv, False), placed_by(es, inv, True)
    rng = random.Random(7)
    shuffled = []
    for _ in range(orders):
        order = list(es)
        rng.shuffle(order)
        shuffled.append(placed_by(order, inv, False))
    best = max(shuffled)
    mixed = entries(n, seed=n, whole_every=10)
    mixed_ours, mixed_first = placed_by(mixed, inv, False), placed_by(mixed, inv, True)
    rows = [
        Row(
            SECTION,
            f"plan(), N={size} on {devices} devices ({timed[size][1]} placed)",
            "ms",
            [timed[size][0] * 1000],
        )
        for size in sizes
    ]
    for small, big in itertools.pairwise(sizes):
        ratio = timed[big][0] / timed[small][0]
        rows.append(
            Row(
                SECTION,
                f"plan time, N={big} over N={small}",
                "x",
                [ratio],
                goal="≤ 12x",
                met=ratio <= 12,
                ratio=ratio,
            )
        )
    rows.append(
        Row(
            SECTION,
            f"placed of {n}, best fit vs first fit",
            "deployments",
            [float(ours)],
            [float(first)],
            alt="first fit, same order",
            goal="≥ first fit",
            met=ours >= first,
        )
    )
    rows.append(
        Row(
            SECTION,
            f"placed of {n}, best fit vs best of {orders} random orders",
            "deployments",
            [float(ours)],
            [float(best)],
            alt=f"best of {orders} shuffles (median {median(shuffled):g})",
        )
    )
    rows.append(
        Row(
            SECTION,
            f"placed of {n}, every 10th a whole-device lease, best fit vs first fit",
            "deployments",
            [float(mixed_ours)],
            [float(mixed_first)],
            alt="first fit, same order",
            goal="≥ first fit",
            met=mixed_ours >= mixed_first,
        )
    )
    return rows


if __name__ == "__main__":
    from benchmarks.report import render_table

    print(render_table(bench(1000)))
