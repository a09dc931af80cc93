"""6. Cold start of 20 engines: ``reconcile --once --wait`` next to supervisord.

Ours: the wall time of ``--once --wait`` on 20 fresh manifests (it exits once every
engine answers its HTTP readiness probe, ``periodSeconds: 0.1``). supervisord's:
from launching ``supervisord`` with the same 20 programs until all 20 answer the
same GET (polled every few ms). Trials alternate between the two.
"""

from __future__ import annotations

import time

from benchmarks import supervisor as sv_mod
from benchmarks.common import (
    HTTP_READY,
    Row,
    answers,
    engine_argv,
    free_port_block,
    manifest,
    median,
    reconcile_argv,
    run,
    wait_for,
    workspace,
)


def _ours(count: int) -> float:
    with workspace("cold") as ws:
        base = free_port_block(count + 10, 24000)
        for i in range(count):
            text = manifest(f"c{i:02d}", engine_argv(), base_port=base, readiness=HTTP_READY)
            (ws.manifests / f"c{i:02d}.yaml").write_text(text)
        took = run([*reconcile_argv(), "--once", "--wait", "--timeout", "60s", *ws.common()],
                   env=ws.env(), timeout=120)  # fmt: skip
        run([*reconcile_argv(), "down", *ws.common()], env=ws.env(), timeout=120)
    return took * 1000


def _supervisord(count: int) -> float:
    with sv_mod.supervisor("cold") as sv:
        base = free_port_block(count + 10, 25000)
        ports = [base + i for i in range(count)]
        for i, port in enumerate(ports):
            sv.add(f"c{i:02d}", port)
        start = time.perf_counter()
        sv.start()
        wait_for(lambda: all(answers(p) for p in ports), 60, "all programs answering", poll=0.01)
        return (time.perf_counter() - start) * 1000


def bench(count: int, trials: int) -> list[Row]:
    ours: list[float] = []
    theirs: list[float] = []
    have_sv = sv_mod.available()
    for _ in range(trials):
        ours.append(_ours(count))
        if have_sv:
            theirs.append(_supervisord(count))
    row = Row(
        section="6. cold start",
        metric=f"{count} engines until all answer",
        unit="ms",
        ours=ours,
        theirs=theirs,
        alt="supervisord" if have_sv else "supervisord (not installed)",
        goal="≤ 1.2x",
    )
    row.met = row.ratio is not None and row.ratio <= 1.2
    return [row]


__all__ = ["bench", "median"]
