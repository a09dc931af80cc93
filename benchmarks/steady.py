"""2. Steady pass: a no-op ``reconcile --once`` with N Ready deployments.

The engines are ``sleep`` processes (no port bound, no readiness probe: Ready as soon
as they run), so 1,000 of them fit on a small machine; each still gets its own port
from a large range. The workspace grows 0 -> 10 -> 100 -> 1,000, converging with
``--once --wait`` before each measurement, and checks that every record is Ready.
"""

from __future__ import annotations

import json
import shutil

from benchmarks.common import (
    Row,
    Workspace,
    free_port_block,
    manifest,
    median,
    reconcile_argv,
    run,
    workspace,
)


def _grow(ws: Workspace, have: int, want: int, base_port: int) -> None:
    sleep = shutil.which("sleep") or "/bin/sleep"
    for i in range(have, want):
        text = manifest(f"d{i:04d}", [sleep, "infinity"], base_port=base_port)
        (ws.manifests / f"d{i:04d}.yaml").write_text(text)
    if want:
        argv = [*reconcile_argv(), "--once", "--wait", "--timeout", "5m", *ws.common()]
        run(argv, env=ws.env(), timeout=600)


def _all_ready(ws: Workspace, n: int) -> None:
    folder = ws.state / "instances"
    phases = [json.loads(p.read_text())["phase"] for p in folder.glob("*.json")] if n else []
    if len(phases) != n or any(p != "Ready" for p in phases):
        raise RuntimeError(
            f"expected {n} Ready records, found {sorted(set(phases))} x{len(phases)}"
        )


def bench(sizes: list[int], trials: int) -> tuple[list[Row], dict[int, list[float]]]:
    times: dict[int, list[float]] = {}
    with workspace("steady") as ws:
        ws.devices = "nvidia:0"
        base_port = free_port_block(max(sizes) + 50, 20000)
        have = 0
        argv = [*reconcile_argv(), "--once", *ws.common()]
        for n in sizes:
            _grow(ws, have, n, base_port)
            have = n
            _all_ready(ws, n)
            run(argv, env=ws.env())  # warm
            times[n] = [run(argv, env=ws.env()) * 1000 for _ in range(_trials(n, trials))]
            _all_ready(ws, n)
    return _rows(sizes, times), times


def _trials(n: int, trials: int) -> int:
    return max(3, trials // 2) if n >= 1000 else trials


def _rows(sizes: list[int], times: dict[int, list[float]]) -> list[Row]:
    zero, small, large = sizes[0], sizes[-2], sizes[-1]
    rows = [
        Row(
            section="2. steady pass",
            metric=f"no-op `--once`, N={n}",
            unit="ms",
            ours=times[n],
            theirs=times[zero] if n != zero else [],
            alt=f"N={zero}" if n != zero else "",
        )
        for n in sizes
    ]
    for row in rows:
        if row.metric.endswith(f"N={small}"):
            row.goal = "≤ 1.5x N=0"
            row.met = row.ratio is not None and row.ratio <= 1.5
    t0 = median(times[zero])
    marginal_small = (median(times[small]) - t0) / (small - zero)
    marginal_large = (median(times[large]) - t0) / (large - zero)
    # The goal compares the marginal cost of N=1,000 with that of N=100 (10x the
    # deployments may cost at most 12x): per deployment, at most 1.2x.
    growth = (median(times[large]) - t0) / max(median(times[small]) - t0, 1e-9)
    rows.append(
        Row(
            section="2. steady pass",
            metric=f"marginal cost N={large} vs N={small} (per deployment: "
            f"{marginal_large:.2f} vs {marginal_small:.2f} ms)",
            unit="x",
            ours=[growth],
            ratio=growth,
            goal=f"≤ {12 * (large - zero) / (small - zero) / 10:g}x",
            met=growth <= 12 * (large - zero) / (small - zero) / 10,
            note="(T(N) - T(0)) for the larger N over that for the smaller",
        )
    )
    return rows
