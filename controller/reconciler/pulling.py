"""The pass's side of pulls: its puller (from the backend), when a model pull fails, and
which ended image pulls no spec needs any more.

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

import pydantic

from controller.backends.base import Backend, Puller
from controller.core.manifest.names import base_name
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.pulls import PullView, key_of_document, origin_of_document
from controller.core.state import Phase, Record
from controller.logsetup import get_logger

log = get_logger(__name__)

STALL_ENV = "RECONCILE_PULL_STALL"  # seconds without a byte before a pull fails (tests: less)
DEFAULT_STALL = 60.0
# Failures in a row after which a pull counts as failing (``--once`` exits 1, ``--wait``
# stops): the first failure is retried at once, as a first restart is; one that fails
# again is backing off, as a crash-looping engine is.
FAILING_AFTER = 2


def puller_of(backend: Backend, state_dir: Path) -> Puller:
    stall = float(os.environ.get(STALL_ENV) or DEFAULT_STALL)
    return backend.puller(state_dir, stall)


def failing(
    records: Iterable[Record],
    pulls: Mapping[str, PullView],
    origins: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """Pulling deployments whose pull failed FAILING_AFTER times in a row: name -> why.

    Read from the pass's view of each key, whose failure a retry leaves in place until
    its own outcome replaces it, so a pass that has just restarted the pull still sees
    the failures. ``origins`` (deployment -> its manifest's source origin) is what the
    manifests say now, where it may differ from the records (``plan`` writes none): a
    failure of the URL the manifest no longer names does not count.
    """
    out: dict[str, str] = {}
    for rec in records:
        key = key_of_document(rec.stored_spec) if rec.phase is Phase.PULLING else None
        view = pulls.get(key) if key is not None else None
        origin = origin_of_document(rec.stored_spec)
        if origins is not None:
            origin = origins.get(base_name(rec.name), origin)
        failure = view.failure_for(origin) if view is not None else None
        if failure is not None and failure.attempts >= FAILING_AFTER:
            out[rec.name] = (
                f"{rec.name}: its pull keeps failing ({failure.attempts} attempts in a row; "
                f"last: {failure.message})"
            )
    return out


def drop_unused_image_pulls(
    backend: Backend, entries: Iterable[Entry], records: Iterable[Record]
) -> None:
    """The ended image pulls that neither this pass's manifests nor any record (of any
    set: the state dir's pulls are shared) runs from: an image edited before the start
    that would have read its pull. A record names the image it is Pulling for, so
    another set's pull that ended is kept for that set's next pass."""
    specs = [entry.deployment.spec for entry in entries]
    specs += [spec for rec in records if (spec := _stored(rec)) is not None]
    dropped = backend.drop_unused_pulls(specs)
    if dropped:
        log.info("image pulls no spec uses forgotten", count=dropped)


def _stored(rec: Record) -> DeploymentSpec | None:
    """The record's spec when it runs in a container, else None (also where it reads as
    no spec now: a format of long ago)."""
    if "container" not in rec.stored_spec:  # spec_document leaves it out of a process's
        return None
    try:
        return DeploymentSpec.model_validate(rec.stored_spec)
    except pydantic.ValidationError:
        return None
