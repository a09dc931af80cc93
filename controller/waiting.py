"""`--once --wait`: keep passing until every deployment is Ready, stuck, or out of time."""

from __future__ import annotations

import sys
import time

from controller.reconciler import PassResult, Reconciler
from controller.state import Phase

STUCK = (Phase.PENDING, Phase.FAILED)


def wait_until_ready(reconciler: Reconciler, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    while True:
        result = reconciler.run_pass()
        _progress(result, shown)
        if result.all_ready:
            return True
        stuck = _stuck(result)
        if stuck:
            print(f"reconcile: cannot progress without you: {stuck}", file=sys.stderr)
            return False
        if time.monotonic() >= deadline:
            waiting = [r.name for r in result.ours() if r.phase is not Phase.READY]
            print(f"reconcile: timed out waiting for {', '.join(waiting)}", file=sys.stderr)
            return False
        time.sleep(min(_period(result), max(deadline - time.monotonic(), 0)))


def _stuck(result: PassResult) -> str:
    if result.errors:
        return "; ".join(str(e) for e in result.errors)
    if result.problems:
        return "; ".join(p.message for p in result.problems)
    bad = [f"{r.name} {r.phase}: {r.message}" for r in result.ours() if r.phase in STUCK]
    return "; ".join(bad)


def _period(result: PassResult) -> float:
    periods = [r.probe.period_seconds for r in result.ours() if r.phase is Phase.STARTING]
    return max(0.2, min(periods, default=1.0))


def _progress(result: PassResult, shown: dict[str, str]) -> None:
    for rec in result.ours():
        line = f"{rec.name}: {rec.phase}" + (f" ({rec.message})" if rec.message else "")
        if shown.get(rec.name) != line:
            shown[rec.name] = line
            print(line, file=sys.stderr)
