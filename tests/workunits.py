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
# The units with more than one test are sent first (tests/conftest.py), most tests first.
ONE_WORKER = {"ray": "ray", "cluster": "cluster"}
# Files whose module-scoped fixture starts processes: a test a unit, each worker that got
# one of the file's tests started the fixture again, and again when it came back to the
# file after another's test (a Chromium, ~10-25 s at load 10-20, four times a run; four
# engines and a pass, ~2.5 s, eight times; a node of engines). Each file is one
# unit: set up once, its tests on one worker. Each has fewer tests than the Ray unit
# (42), which stays the first sent: the longest chain.
ONE_WORKER_FILES = frozenset(
    {
        "tests/ui/test_page.py",  # browser (tests/ui/conftest.py)
        "tests/ux/test_ux_replicas.py",  # up_once
        "tests/harness/test_failpoints.py",  # node
        "tests/harness/test_squatters.py",  # node
    }
)


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its folder's or file's shared one (ONE_WORKER,
    ONE_WORKER_FILES), else its own."""
    path = nodeid.split("::")[0]
    if path in ONE_WORKER_FILES:
        return path
    parts = Path(path).parts
    top = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return ONE_WORKER.get(top, nodeid)
