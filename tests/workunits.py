"""The units of work pytest-xdist schedules for this suite (tests/conftest.py's
scheduler): a file, or a folder that shares one worker."""

from __future__ import annotations

from pathlib import Path

# `scripts/test` runs the suite on two workers (pytest-xdist, `--dist loadgroup`; most
# tests wait on processes, not the CPU). A file stays on one worker, so its module
# fixtures are built once. The Ray tests and the namespace cluster share one worker, one
# after the other: each checks at teardown that no Ray engine outlived its cluster, and
# the namespace cluster holds fixed namespace names and ports.
ONE_WORKER = {"ray": "ray", "cluster": "ray"}


def work_unit(nodeid: str) -> str:
    """The group a test runs in: its file, or its folder's shared one (ONE_WORKER)."""
    path = nodeid.split("::")[0]
    parts = Path(path).parts
    top = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return ONE_WORKER.get(top, path)
