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


Pair = tuple[float, float]  # (N=0 reference, N=n), run back to back


def bench(sizes: list[int], trials: int) -> tuple[list[Row], dict[int, list[Pair]]]:
    """Each N=n run is paired with a run on an empty workspace just before it, so the
    machine's noise hits both; ratios and marginal costs come from the pairs."""
    pairs: dict[int, list[Pair]] = {}
    with workspace("steady") as ws, workspace("steady-empty") as empty:
        ws.devices = empty.devices = "nvidia:0"
        base_port = free_port_block(max(sizes) + 50, 20000)
        have = 0
        argv = [*reconcile_argv(), "--once", "--allow-empty", *ws.common()]  # N=0 is empty
        ref = [*reconcile_argv(), "--once", "--allow-empty", *empty.common()]  # empty is meant
        run(ref, env=empty.env())  # warm, and make its state dir
        for n in sizes:
            _grow(ws, have, n, base_port)
            have = n
            _all_ready(ws, n)
            run(argv, env=ws.env())  # warm
            pairs[n] = [
                (run(ref, env=empty.env()) * 1000, run(argv, env=ws.env()) * 1000)
                for _ in range(_trials(n, trials))
            ]
            _all_ready(ws, n)
    return _rows(sizes, pairs), pairs


def _trials(n: int, trials: int) -> int:
    return max(3, trials // 2) if n >= 1000 else trials


def _rows(sizes: list[int], pairs: dict[int, list[Pair]]) -> list[Row]:
    small, large = sizes[-2], sizes[-1]
    rows = []
    for n in sizes:
        row = Row(
            section="2. steady pass",
            metric=f"no-op `--once`, N={n}",
            unit="ms",
            ours=[t for _, t in pairs[n]],
            theirs=[t0 for t0, _ in pairs[n]] if n else [],
            alt="N=0, run just before each" if n else "",
            ratio=median([t / t0 for t0, t in pairs[n]]) if n else None,
        )
        if n == small:
            row.goal = "≤ 1.5x N=0"
            row.met = row.ratio is not None and row.ratio <= 1.5
        rows.append(row)
    extra_small = median([t - t0 for t0, t in pairs[small]])
    extra_large = median([t - t0 for t0, t in pairs[large]])
    # The goal compares the marginal cost of N=1,000 with that of N=100: 10x the
    # deployments may cost at most 12x (per deployment, at most 1.2x).
    limit = 1.2 * large / small
    if extra_small <= 0:  # tiny N (--quick): below the noise, nothing to compare
        return rows
    growth = extra_large / extra_small
    rows.append(
        Row(
            section="2. steady pass",
            metric=f"marginal cost, N={large} over N={small} (per deployment: "
            f"{extra_large / large:.2f} vs {extra_small / small:.2f} ms)",
            unit="x",
            ours=[growth],
            ratio=growth,
            goal=f"≤ {limit:g}x",
            met=growth <= limit,
            note="median of T(N) - T(0) over the pairs, the larger N over the smaller",
        )
    )
    return rows
