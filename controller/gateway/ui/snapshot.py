"""What the page shows, read from the state dir (call it off the gateway's loop).

The deployments are ``status -o json``'s items (``conditions`` included: an emptied
manifest folder that holds them is said here as there) and the devices ``devices -o
json``'s, built by the same code (``core/statusjson.py``) from every record of the state dir; the
events are every deployment's journal merged, newest first. Read-only: a record the
gateway cannot parse is named in ``unreadable`` (its file, what is wrong and the next
move, as `status` says it) and, as in `status`, has no row (the watch's last good
reading, ``records_watch.py``, only holds its devices); nothing is quarantined or
rewritten from here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller import __version__
from controller.core.devicefaults import DeviceFault
from controller.core.devices.inventory import Inventory
from controller.core.state import Record
from controller.core.statusjson import deployment_items, device_items, iso
from controller.errors import ConfigError
from controller.gateway.records_watch import RecordsWatch
from controller.host import bootclock, devices
from controller.store.config.node import read_drain
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordProblem, held_by_unreadable
from controller.store.models import pullstatus
from controller.store.side import devicehealth, observed
from controller.store.statedir import StateDir

EVENTS = 200  # the newest events the page gets
INVENTORY_TTL = 5.0  # seconds a discovered inventory is reused (NVML is not free)


@dataclass
class NodeReader:
    """What the page shows of the node, read from its state dir: records (watched),
    inventory (kept a few seconds), device faults, the drain, events."""

    state_dir: Path
    node: str
    devices: str | None  # the daemon's static inventory (--devices), else discovery
    watch: RecordsWatch = field(init=False)
    _inventory: tuple[float, Inventory] | None = None

    def __post_init__(self) -> None:
        self.watch = RecordsWatch(self.state_dir, owner="", node="")

    def records(self) -> list[Record]:
        """Every record of the state dir (re-read only when the folder changed)."""
        stamp = self.watch.changed()
        if stamp is not None:
            self.watch.read(stamp)
        return self.watch.everything()

    def inventory(self) -> Inventory:
        now = time.monotonic()
        if self._inventory is None or now - self._inventory[0] > INVENTORY_TTL:
            self._inventory = (now, devices.resolve(self.devices))
        return self._inventory[1]

    def state(self, events_of: str | None) -> dict[str, Any]:
        everything = self.records()  # first: it reads what changed, problems too
        problems = self.watch.problems  # named as `status` names them; moved nowhere
        records, held = _readable(everything, problems)
        now = datetime.now(UTC)
        shown, pulls = pullstatus.live(records, self.state_dir)
        noted = observed.views(observed.peek_all(self.state_dir), records)
        shown = [noted.as_read(r) for r in shown]  # no stale spec-invalid mark, as `status`
        shown = [replace(r, message=r.message_at(now)) for r in shown]  # "restart in 8s" now
        return {
            "node": self.node,
            "version": __version__,
            "now": iso(now),
            "drain": self.drain(),
            "deployments": deployment_items(shown, pulls, noted.seen, noted.conditions),
            "facts": {r.name: facts(r) for r in records},
            "devices": device_items(self.inventory().devices, records, self.faults(), held),
            "unreadable": [
                {"name": p.name, "file": p.path, "message": p.message} for p in problems
            ],
            "events": self.events(events_of),
            "source": self.source(records),
        }

    def source(self, records: list[Record]) -> dict[str, Any] | None:
        """The git source the node follows, as ``reconcile source -o json`` shows it (its
        state from the status file and its records' phases); None when it follows none.
        The git source's module (its codecs, subprocess) is loaded only where there is one:
        a gateway that follows none starts ~10 ms sooner (a test suite starts thousands)."""
        if not StateDir(self.state_dir).git_source.exists():
            return None
        from controller.store.sources.git import source as gitsource

        st = gitsource.peek_status(self.state_dir)
        if st is None:
            return None
        state, message = gitsource.state_of(st, gitsource.phases_of(records, st.owner))
        return gitsource.as_json(st, state, message)

    def faults(self) -> Mapping[str, DeviceFault]:
        try:
            return devicehealth.peek(self.state_dir).faults  # the page moves nothing
        except ConfigError:  # unreadable: the daemon says so; the bars still show
            return {}

    def drain(self) -> dict[str, Any] | None:
        try:
            found = read_drain(self.state_dir)
        except ConfigError as exc:
            return {"active": True, "until": None, "by": "", "reason": str(exc)}
        now, clock = datetime.now(UTC), bootclock.read()  # its ttl runs on the boot clock
        if found is None or not found.active(now, clock):
            return None
        until = iso(found.ends(now, clock))
        return {"active": True, "until": until, "by": found.by, "reason": found.reason}

    def events(self, only: str | None) -> list[dict[str, Any]]:
        """The newest events, newest first; ``only``: one deployment's (its replicas')."""
        journal = Journal(self.state_dir)
        out = [
            {"deployment": name, **event}
            for name in journal.names()
            if only is None or name == only or name.partition("@")[0] == only
            for event in journal.read(name, last=EVENTS)
        ]
        out.sort(key=lambda e: str(e.get("time", "")), reverse=True)
        return out[:EVENTS]


def _readable(
    records: list[Record], problems: list[RecordProblem]
) -> tuple[list[Record], dict[str, str]]:
    """The records to show, by name, and what the unreadable ones hold (device -> holder).

    A record torn where it lies is not shown, as `status` shows it not: the watch's last
    good reading of it (the gateway routes with it meanwhile) may be stale, so its row
    goes and what that reading leased shows held by ``NAME (torn record)``, phase Unknown,
    until a pass adopts its engine. An unknown version's holds what it names."""
    torn = {p.name for p in problems if p.torn and p.name}
    held, _ = held_by_unreadable(problems)
    for rec in records:
        if rec.name in torn and rec.holds:
            held.update(dict.fromkeys(rec.devices, f"{rec.name} (torn record)"))
    kept = [r for r in records if r.name not in torn]
    return sorted(kept, key=lambda r: r.name), held


def facts(rec: Record) -> dict[str, Any]:
    """What the page needs beyond the status item: the model names and activation."""
    return {"models": list(rec.models), "on_demand": rec.on_demand}
