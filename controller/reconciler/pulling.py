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
from datetime import datetime
from pathlib import Path

import pydantic

from controller.backends.base import Backend, Puller
from controller.core.imagepulls import ImageWait
from controller.core.manifest.names import base_name, instance_of
from controller.core.manifest.sources import Source
from controller.core.manifest.specs import DeploymentSpec, Entry, next_name
from controller.core.plan import Desired
from controller.core.pulls import PullView
from controller.core.state import Phase, Record, RecordView
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
    records: Iterable[Record], pulls: Mapping[str, PullView], sources: Mapping[str, Source]
) -> dict[str, str]:
    """Deployments whose manifest's source failed FAILING_AFTER times in a row: name -> why.

    By the manifest's source (``sources``: deployment -> it), not a record's: a rolling
    update pulls for its ``@next`` with no record of its own while the old instance
    serves (Ready), and ``plan`` writes no record for a source just edited (a failure of
    the URL the manifest no longer names does not count). Only deployments with a
    record in ``records`` (``replicas: 0`` wants no pull). Read from the pass's view of
    each key, whose failure a retry leaves in place until its own outcome replaces it,
    so a pass that has just restarted the pull still sees the failures.
    """
    present = {base_name(rec.name) for rec in records}
    out: dict[str, str] = {}
    for name, source in sorted(sources.items()):
        view = pulls.get(source.key) if name in present else None
        failure = view.failure_for(source.origin) if view is not None else None
        if failure is not None and failure.attempts >= FAILING_AFTER:
            out[name] = (
                f"{name}: its pull keeps failing ({failure.attempts} attempts in a row; "
                f"last: {failure.message})"
            )
    return out


def fetching(
    backend: Backend, desired: Desired, records: Mapping[str, RecordView], now: datetime
) -> tuple[dict[str, ImageWait], dict[str, frozenset[str]]]:
    """Deployment -> why its start waits for what the backend fetches first (its image;
    ``Observed.fetching``). Asked only of deployments that may be placed now (an
    instance with no record, Pending, Pulling, Idle, or whose back-off holding nothing
    is over), so a Ready engine's pass costs no runtime call (but for the pass that plans
    its rolling update, whose words say the pull comes first: on a cluster, on the node
    the look picked, where the launch goes). Once per deployment, with how many of its
    instances may start and the devices the starts placed before them may take (a
    cluster looks wider when they may not all fit without preempting). With it,
    deployment -> the nodes its look found the image on (``Observed.images_on``)."""
    instances = desired.instances()
    # a rolling update's `@next` whose pull failed is placed afresh after its back-off too
    nexts = {n: instances[instance_of(n)] for n in records if instance_of(n) in instances}
    starting: dict[str, list[Entry]] = {}
    for name, entry in {**instances, **nexts}.items():
        rec = records.get(name)
        if _may_start(rec, now) or _rolls(rec, entry, records):
            starting.setdefault(entry.name, []).append(entry)
    out: dict[str, ImageWait] = {}
    on: dict[str, frozenset[str]] = {}
    ahead = 0  # the devices the starts the planner places first may take (any spec's)
    for name, entries in sorted(starting.items(), key=_placed_first):
        spec = entries[0].deployment.spec
        if spec.container is not None:
            why = backend.fetching(spec, len(entries), ahead)
            if why is not None:
                out[name] = why
            if nodes := backend.image_nodes(spec):
                on[name] = nodes
        ahead += spec.devices.count * len(entries)
    return out, on


def _placed_first(item: tuple[str, list[Entry]]) -> tuple[int, str]:
    """The planner's order of starts (placing.py): highest priority first, then name."""
    name, entries = item
    return -entries[0].deployment.spec.priority, name


def _rolls(rec: RecordView | None, entry: Entry, records: Mapping[str, RecordView]) -> bool:
    """A Ready engine whose spec changed and whose `@next` is not started yet: a rolling
    update's new instance pulls its image before it takes a device or port, which the
    plan's words say (the state is the launch's: it holds nothing while it pulls; on a
    cluster, the actor pulls on its node, the one the look picked for the launch)."""
    if entry.deployment.spec.strategy != "RollingUpdate" or rec is None:
        return False
    if rec.record.phase is not Phase.READY or rec.record.spec_hash == entry.hash:
        return False
    return next_name(rec.record.name) not in records


def _may_start(rec: RecordView | None, now: datetime) -> bool:
    if rec is None:
        return True
    record = rec.record
    if record.phase in (Phase.PENDING, Phase.PULLING, Phase.IDLE):  # Idle: a request wakes it
        return True
    due = record.backoff_until is None or record.backoff_until <= now
    return record.unleased_backoff and due


def sources_of(entries: Iterable[Entry]) -> dict[str, Source]:
    """Deployment -> the source its manifest pulls (those with one)."""
    return {e.name: s for e in entries if (s := e.deployment.spec.source) is not None}


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
