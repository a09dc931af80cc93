"""The pass's side of model pulls: its puller (from the backend) and when a pull fails.

The backend hands the pass its puller (``Backend.puller``): the local one runs pull
processes on this host, a cluster's pulls on the node that will run the engine. The
planner reads its :meth:`~controller.backends.base.Puller.observe` (each cache key:
cached, pulled now, failed, or not there) and the executor starts a pull for a
:class:`Pull` that says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from controller.backends.base import Backend, Puller
from controller.core.pulls import PullView, key_of_document
from controller.core.state import Phase, Record

STALL_ENV = "RECONCILE_PULL_STALL"  # seconds without a byte before a pull fails (tests: less)
DEFAULT_STALL = 60.0
# Failures in a row after which a pull counts as failing (``--once`` exits 1, ``--wait``
# stops): the first failure is retried at once, as a first restart is; one that fails
# again is backing off, as a crash-looping engine is.
FAILING_AFTER = 2


def puller_of(backend: Backend, state_dir: Path) -> Puller:
    stall = float(os.environ.get(STALL_ENV) or DEFAULT_STALL)
    return backend.puller(state_dir, stall)


def failing(records: Iterable[Record], pulls: Mapping[str, PullView]) -> dict[str, str]:
    """Pulling deployments whose pull failed FAILING_AFTER times in a row: name -> why.

    Read from the pass's view of each key, whose failure a retry leaves in place until
    its own outcome replaces it, so a pass that has just restarted the pull still sees
    the failures.
    """
    out: dict[str, str] = {}
    for rec in records:
        key = key_of_document(rec.stored_spec) if rec.phase is Phase.PULLING else None
        view = pulls.get(key) if key is not None else None
        failure = view.failure if view is not None else None
        if failure is not None and failure.attempts >= FAILING_AFTER:
            out[rec.name] = (
                f"{rec.name}: its pull keeps failing ({failure.attempts} attempts in a row; "
                f"last: {failure.message})"
            )
    return out
