"""1. Start-up: ``reconcile --once`` on an empty folder next to ``python -c pass``.

Both run on the same interpreter (the one the ``reconcile`` script names), interleaved
so that the machine's noise hits both alike.
"""

from __future__ import annotations

from benchmarks.common import PYTHON, Row, median, reconcile_argv, run, workspace


def bench(trials: int) -> list[Row]:
    ours: list[float] = []
    base: list[float] = []
    with workspace("startup") as ws:
        # An empty folder is exit 1 without --allow-empty (nothing pruned): say it is meant.
        argv = [*reconcile_argv(), "--once", "--allow-empty", *ws.common()]
        env = ws.env()
        run(argv, env=env)  # warm the page cache and write the state dir
        run([PYTHON, "-c", "pass"], env=env)
        for _ in range(trials):
            base.append(run([PYTHON, "-c", "pass"], env=env) * 1000)
            ours.append(run(argv, env=env) * 1000)
    ratio = median(ours) / median(base)
    return [
        Row(
            section="1. start-up",
            metric="`reconcile --once`, empty folder",
            unit="ms",
            ours=ours,
            theirs=base,
            alt="`python -c pass`",
            goal="≤ 2.5x",
            met=ratio <= 2.5,
        )
    ]
