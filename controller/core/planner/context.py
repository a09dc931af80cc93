"""What one plan reads (frozen inputs) and the requests its judging hands on.

Judging a record never places anything: it returns actions, or a :class:`Want` (start
this deployment) or a :class:`Roll` (start its ``@next`` beside it), which the
placing step turns into actions against the plan's ledger, or a :class:`Prefetch`
(pull a recreate's model files first), which the pull gate turns into a Pull or a Replace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from controller.core.actions import AnyAction
from controller.core.devices.capacity import Limits
from controller.core.devices.inventory import Inventory
from controller.core.manifest.names import base_name, in_repo, instance_of, replica_name
from controller.core.manifest.specs import Entry
from controller.core.state import Activation, Drain, Observed, Record

# What a file cut to nothing means for what it declared (invariant 4's kin: an editor's
# save on a full disk must not stop an engine; deleting the file is how to remove one).
EMPTIED = (
    "the file is empty (a save cut short? a full disk?): what it declared is left as it "
    "was; delete the file to remove it"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Desired:
    owner: str
    entries: Mapping[str, Entry] = field(default_factory=dict)
    # name -> error, for every manifest that did not load (one in ``skipped`` too gets no
    # record here, but an engine that runs here for it is kept: invariant 4)
    invalid: Mapping[str, str] = field(default_factory=dict)
    broken_sources: frozenset[str] = frozenset()
    source_errors: Mapping[str, str] = field(default_factory=dict)  # broken file -> its error
    emptied: frozenset[str] = frozenset()  # files cut to nothing: what they declared stays
    prune: bool = True  # False: a folder is missing or empty (invariant 5)
    # OnDemand deployments the gateway asked for: name -> last request (and in flight).
    activations: Mapping[str, Activation] = field(default_factory=dict)
    # Desired replica count per deployment (the autoscaler's, where it runs); a name
    # missing here gets its spec's ``initial_replicas``.
    replicas: Mapping[str, int] = field(default_factory=dict)
    # `reconcile restart NAME`: name -> when it was asked; an instance started before
    # that is restarted (rolling where the strategy says so), one started since is not.
    restarts: Mapping[str, datetime] = field(default_factory=dict)
    revision: str | None = None  # the manifests' git commit, stated on every record
    # Deployments left to other nodes (name -> their nodeSelector): not in ``entries``, so
    # never started or kept here; `plan` and `--once` say how many and why.
    skipped: Mapping[str, str] = field(default_factory=dict)
    # The node's git checkout (whether this run follows git or not): a file in it, this
    # run's manifest or another set's record, is named from it in what the plan says
    # (``manifests/a.yaml``), as the repository names it; any other file as it is.
    repo: Path | None = None
    # The manifest folders this run reads, as its files are named: a record whose file
    # lies outside them was written from another checkout of the same set (a CI's `plan
    # --owner`), so its file differing is no move (records.py ``moved``).
    folders: tuple[str, ...] = ()

    def restart_due(self, rec: Record) -> bool:
        """A restart was asked for ``rec``'s deployment after its engine started."""
        asked = self.restarts.get(base_name(rec.name))
        return asked is not None and rec.started_at is not None and rec.started_at < asked

    def stale(self, rec: Record, entry: Entry) -> bool:
        """The instance must give way to a new one: another spec, or a restart asked."""
        return rec.spec_hash != entry.hash or self.restart_due(rec)

    def count(self, name: str) -> int:
        """How many replicas of deployment ``name`` should run."""
        entry = self.entries.get(name)
        if name in self.replicas:
            return max(0, self.replicas[name])
        return entry.deployment.spec.initial_replicas if entry is not None else 0

    def instances(self) -> dict[str, Entry]:
        """Record name -> its deployment's entry, for every replica that should exist.

        Replica 0 is always there, even at ``replicas: 0``: its record (Idle, holding
        nothing) is how status keeps showing a deployment scaled to zero.
        """
        out: dict[str, Entry] = {}
        for name, entry in self.entries.items():
            for i in range(max(1, self.count(name))):
                out[replica_name(name, i)] = entry
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Context:
    """Everything a plan reads; ``drain`` is set only while the node's drain is active."""

    desired: Desired
    observed: Observed
    inventory: Inventory
    now: datetime
    extra_ports: Mapping[str, int]
    limits: Limits
    drain: Drain | None
    instances: Mapping[str, Entry]  # record name -> entry: every replica desired

    def entry(self, record: str) -> Entry | None:
        """The entry a record of that name runs, while that replica is desired."""
        return self.instances.get(instance_of(record))

    def scaled_away(self, record: str) -> bool:
        """A replica of a valid deployment beyond its desired count."""
        return instance_of(record) not in self.instances and base_name(record) in (
            self.desired.entries
        )

    def unselected(self, rec: Record) -> str | None:
        """Why a record whose deployment is still declared is no longer wanted here: its
        nodeSelector no longer matches this node's labels (None: it is not declared)."""
        selector = self.desired.skipped.get(base_name(rec.name))
        if selector is None:
            return None
        return f"nodeSelector {selector} no longer matches this node's labels"

    def still_declaring(self, rec: Record) -> list[str]:
        """What the file of an undeclared ``rec`` declares now (sorted): a name edited
        in place, or a document taken out of several; none when the file is gone."""
        return sorted(e.name for e in self.desired.entries.values() if e.source == rec.source)

    def removed(self, rec: Record, gone: str) -> str:
        """Why an undeclared record goes: its file gone (``gone``, ``{}`` for the file), or
        still there declaring others: a ``metadata.name`` edited in place (a rename) is no
        "manifest removed" to the one who edited it, whose file is right there. A new name
        there may be a rename or a document swapped in a multi-document file: asked, not
        said."""
        was = in_repo(self.desired.repo, rec.source)
        there = self.still_declaring(rec)
        if not there:
            return gone.format(was)
        recorded = {base_name(n) for n in self.observed.records}
        new = [name for name in there if name not in recorded]
        if new:
            return f"removed from {was}, which now declares {', '.join(new)} (renamed in place?)"
        return f"removed from {was} (the file is still there, declaring {', '.join(there)})"

    def scaled_to_zero(self, record: str) -> bool:
        return instance_of(record) in self.instances and self.desired.count(base_name(record)) == 0

    @classmethod
    def of(
        cls,
        desired: Desired,
        observed: Observed,
        inventory: Inventory,
        now: datetime,
        *,
        extra_ports: Mapping[str, int],
        limits: Limits,
    ) -> Context:
        drain = observed.drain
        return cls(
            desired=desired,
            observed=observed,
            inventory=inventory,
            now=now,
            extra_ports=extra_ports,
            limits=limits,
            drain=drain if drain is not None and drain.active(now, observed.boot) else None,
            instances=desired.instances(),
        )

    def ours(self, rec: Record) -> bool:
        return rec.owner == self.desired.owner

    def drain_text(self) -> str:
        drain = self.drain
        assert drain is not None
        return drain.said(self.now, self.observed.boot)


@dataclass(frozen=True, slots=True)
class Want:
    """Start ``entry`` as record ``name`` (default: the deployment's own name, replica 0):
    placed once every record is judged, highest priority first. ``room_only``: its image
    is not on every node it may land on (``ImageWait.room``): placed into free room alone,
    else it waits Pending, holding nothing and preempting nobody, saying why (its room
    taken, a limit) and why it preempts nobody (the image)."""

    entry: Entry
    why: str
    name: str | None = None
    room_only: str | None = None

    @property
    def record(self) -> str:
        return self.name or self.entry.name


@dataclass(frozen=True, slots=True)
class Roll:
    """RollingUpdate: start ``<instance>@next`` beside the Ready old instance ``name``
    (default: replica 0), or recreate it when the deployment's maxUnavailable allows."""

    entry: Entry
    why: str
    fields: tuple[str, ...]
    name: str | None = None

    @property
    def record(self) -> str:
        return self.name or self.entry.name


@dataclass(frozen=True, slots=True)
class Prefetch:
    """A recreate of the Ready instance ``name`` whose new spec's model files are not in
    the cache: they are pulled first while it serves (``planner/pulling``'s gate makes
    it a :class:`~controller.core.actions.Pull` that writes no record), and it is
    replaced once they are there, as a new image is pulled before its recreate."""

    entry: Entry
    why: str
    fields: tuple[str, ...]
    name: str

    @property
    def record(self) -> str:
        return self.name


# What judging one record gives: actions, and requests for the placing step; once
# through the pull gate (``planner/pulling``), every Prefetch is a Pull or a Replace.
Judged = AnyAction | Want | Roll | Prefetch
Gated = AnyAction | Want | Roll
