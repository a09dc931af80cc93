"""The units of work pytest-xdist schedules for this suite (tests/conftest.py's
scheduler): a test on its own, or a folder whose tests share one worker."""

from __future__ import annotations

from pathlib import Path

# `scripts/test` runs the suite on four workers (pytest-xdist, `--dist loadgroup`): most
# tests wait on processes, so a third worker still gained on 2 cores (2026-12-04, this box:
# 806 s of pytest on two, 664 s on three), and once the fixture's CLI calls were forked
# warm (tests/warmcli.py) a fourth did too (2026-12-06, one commit, idle box, one run
# each: 925 s on three, the CPU ~26% idle by vmstat; 777 s on four, ~13% idle). A test is a
# unit of its own, so the workers stay busy to the end: a file as one unit measured
# 1068 s against 937 s, its long files (~2 min each) ending the run on one worker while
# the others idled. The Ray tests are one unit, on one worker: their Ray cluster is built
# once (tests/ray/conftest.py), and each checks at teardown that no engine of its
# clusters outlived them. The namespace cluster's tests (tests/cluster) are another: its
# Ray nodes are started once a module, on addresses of their own. It was in the Ray unit,
# ~40-80 s of the run's longest chain; the two clusters never see each other's engines
# (rayhelp.ray_engines knows its own raylets; a host's processes are its namespace's).
# The units with more than one test, these two, are sent first (tests/conftest.py).
ONE_WORKER = {"ray": "ray", "cluster": "cluster"}


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its folder's shared one (ONE_WORKER), else its own."""
    parts = Path(nodeid.split("::")[0]).parts
    top = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return ONE_WORKER.get(top, nodeid)
