"""A deployment's records seen as one: its replicas and their rolling ``@next`` instances.

``status``, ``describe``, ``logs`` and the metrics show deployments, while the store
holds records (``web``, ``web@1``, ``web@next``, ``web@2@next``: core/manifest/names.py). This
groups them. Pure: no pydantic either (status never loads it).

The desired count is read from the records themselves: the planner keeps exactly one
record per desired replica (a Pending one when it has no room; replica 0 Idle when the
deployment is scaled to 0), so the records are its expansion of ``spec.replicas`` or the
autoscaler's count, written in the same pass that changes it. A count stored in each
record would go stale on every replica a scale change leaves untouched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.manifest.names import base_name, is_next, replica_of
from controller.core.state import Phase, Record

# A deployment's phase is its worst replica's: the one that needs a look first.
WORST_FIRST = (
    Phase.FAILED,
    Phase.BACKOFF,
    Phase.PENDING,
    Phase.TERMINATING,
    Phase.PULLING,
    Phase.RESERVED,
    Phase.STARTING,
    Phase.IDLE,
    Phase.SUCCEEDED,
    Phase.READY,
)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica: its record, and the ``@next`` a RollingUpdate runs beside it."""

    index: int
    record: Record  # the replica's record; its lone ``@next`` while only that one exists
    rolling: Record | None = None

    @property
    def records(self) -> tuple[Record, ...]:
        return (self.record,) if self.rolling is None else (self.record, self.rolling)

    @property
    def ready(self) -> bool:
        """Serving: the old instance or its new one is Ready (each replica counts once)."""
        return any(r.phase is Phase.READY for r in self.records)

    @property
    def phase(self) -> Phase:
        """Ready while it serves (a rolling ``@next`` still Starting is no fault), else
        its record's phase."""
        return Phase.READY if self.ready else self.record.phase


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    name: str  # the deployment
    replicas: tuple[Replica, ...]  # by index, never empty

    @property
    def first(self) -> Record:
        """Replica 0's record: the one a deployment of one replica always was."""
        return self.replicas[0].record

    @property
    def records(self) -> tuple[Record, ...]:
        """Every record, each replica's followed by its ``@next``."""
        return tuple(r for replica in self.replicas for r in replica.records)

    @property
    def desired(self) -> int:
        first = self.replicas[0]
        if first.index == 0 and scaled_to_zero(first.record):
            return 0
        return len(self.replicas)

    @property
    def ready(self) -> int:
        return sum(r.ready for r in self.replicas)

    @property
    def restarts(self) -> int:
        """Every instance's restarts: what the status table and the page show."""
        return total_restarts(self.records)

    @property
    def worst_phase(self) -> Phase:
        """The phase of the replica that needs a look first (``WORST_FIRST``)."""
        return min((r.phase for r in self.replicas), key=WORST_FIRST.index)


def total_restarts(records: Iterable[Record]) -> int:
    return sum(r.restarts for r in records)


def scaled_to_zero(rec: Record) -> bool:
    """Replica 0 kept Idle with nothing running: ``replicas: 0`` or autoscaled to 0.

    An OnDemand deployment's Idle record is one replica waiting for a request (0/1).
    """
    return rec.phase is Phase.IDLE and not rec.on_demand


def group(records: Iterable[Record]) -> list[ReplicaSet]:
    """The deployments these records belong to, by name; replicas by index."""
    slots: dict[str, dict[int, list[Record]]] = {}
    for rec in records:
        by_index = slots.setdefault(base_name(rec.name), {})
        by_index.setdefault(replica_of(rec.name), []).append(rec)
    return [
        ReplicaSet(name, tuple(_replica(i, recs) for i, recs in sorted(by_index.items())))
        for name, by_index in sorted(slots.items())
    ]


def _replica(index: int, records: list[Record]) -> Replica:
    own = [r for r in records if not is_next(r.name)]
    rolling = [r for r in records if is_next(r.name)]
    if not own:  # between a promotion's steps: the new instance is the replica now
        return Replica(index, rolling[0])
    return Replica(index, own[0], rolling[0] if rolling else None)


def selects(name: str, rec: Record) -> bool:
    """``status NAME``: NAME is the deployment (a record's own name picks its deployment)."""
    return base_name(rec.name) == base_name(name)


def picked(name: str, records: Iterable[Record]) -> list[Record]:
    """The records ``status NAME`` and ``describe NAME`` show: NAME's deployment, where
    NAME is one or one of its records (``web@1`` picks ``web``). A replica's name that
    no record has picks nothing: ``web@7`` of a 3-replica web showed all of web, exit 0."""
    recs = list(records)
    if name != base_name(name) and all(rec.name != name for rec in recs):
        return []
    return [rec for rec in recs if selects(name, rec)]
