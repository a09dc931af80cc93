"""A cluster that does not answer: its records say their state is unknown, and why.

As Kubernetes marks a node NotReady and leaves its pods be, a pass that cannot reach the
cluster (its head down: ``BackendUnavailable``) moves nothing, and each cluster record
of the set keeps its phase, engine and devices, its message saying that its state is
unknown since when, why, and the next move (``mark``; the words are ``core/state``'s, so
every view says such a phase is in doubt). Nothing is started in its place:
the engine may run on. The first pass that reaches the cluster again judges each record
through its actor as always (adopted if the actor lived on, lost and started again if
not); a record that pass left as it was gets its message back (``clear``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from datetime import UTC, datetime

from controller.core.state import Record, unknown_mark
from controller.store.instances.records import RecordStore
from controller.store.lock import FileLock


def mark(store: RecordStore, lock: FileLock, owner: str, why: str, timeout: float) -> list[str]:
    """Each of ``owner``'s cluster records not marked yet says so; the names marked."""
    message = unknown_mark(datetime.now(UTC), why)
    marked = []
    with lock.hold(timeout):
        for rec in store.load().records.values():
            if rec.owner == owner and rec.on_cluster and not rec.state_unknown:
                store.write(dataclasses.replace(rec, message=message))
                marked.append(rec.name)
    return marked


def clear(store: RecordStore, records: MutableMapping[str, Record], owner: str) -> None:
    """A pass reached the cluster: the marks it left standing go (call under the pass lock)."""
    for name, rec in list(records.items()):
        if rec.owner == owner and rec.state_unknown:
            records[name] = dataclasses.replace(rec, message="")
            store.write(records[name])
