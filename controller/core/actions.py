"""What a pass will do: frozen actions, each with a human ``reason``.

The planner returns them; the executor applies them and decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from controller.core.specs import Entry
from controller.core.state import ExitInfo, Instance, MarkedProcess, Phase, ProcessRef


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    verb: ClassVar[str] = "action"
    name: str
    reason: str

    def describe(self) -> str:
        return f"{self.verb} {self.name}: {self.reason}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Start(Action):
    """Reserve devices and a port, then spawn (a new or Pending deployment)."""

    verb = "start"
    entry: Entry
    devices: tuple[str, ...]
    port: int
    extra_ports: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart(Action):
    """Respawn in place: same devices and port, new nonce (after a crash or back-off)."""

    verb = "restart"
    entry: Entry
    restarts: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Stop(Action):
    """Tear the instance down completely, then drop its record."""

    verb = "stop"


@dataclass(frozen=True, kw_only=True, slots=True)
class Replace(Stop):
    """The spec changed: tear down now, a later round starts the new one."""

    verb = "replace"
    fields: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Promote(Action):
    """RollingUpdate: ``<name>@next`` is Ready (or ``name``'s record is gone): the gateway
    moves to it, the old instance drains its in-flight requests and stops, and the new
    record takes the deployment's name. Each step is safe to repeat after a crash."""

    verb = "promote"


@dataclass(frozen=True, kw_only=True, slots=True)
class Park(Action):
    """OnDemand: tear down whatever runs (idle, or swapped out) and record it ``Idle``."""

    verb = "park"
    entry: Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class Update(Action):
    """Only fields the running engine never sees changed (readiness, restartPolicy,
    stopGracePeriodSeconds): rewrite the record in place, no restart."""

    verb = "update"
    entry: Entry
    fields: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Preempt(Action):
    """Stop a running engine so a deployment of higher priority fits; keep it Pending.

    The planner chose it (fewest, lowest, most recently started); the record stays,
    holding nothing, and a later pass starts it again when room returns.
    """

    verb = "preempt"
    by: str
    priority: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Fail(Action):
    """Kill what is left of the instance and record the outcome.

    ``phase`` is BackOff (restart at ``retry_at``), Failed or Succeeded (devices released).
    """

    verb = "fail"
    phase: Phase
    retry_at: datetime | None = None
    restarts: int = 0
    exit: ExitInfo | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkReady(Action):
    verb = "ready"


@dataclass(frozen=True, kw_only=True, slots=True)
class Adopt(Action):
    """A reservation whose maker died: its engine is running, take it over."""

    verb = "adopt"
    ref: ProcessRef


@dataclass(frozen=True, kw_only=True, slots=True)
class Resync(Action):
    """The backend moved or restarted the engine on its own (Ray after a node loss or a
    crash): write where it runs now; a new engine counts a restart and is probed again."""

    verb = "resync"
    instance: Instance
    restarted: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Release(Action):
    """Drop a record that holds no process (dead reservation, removed Pending, ...)."""

    verb = "release"
    nonce: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Reap(Action):
    """Kill marker processes no record accounts for (invariant 3)."""

    verb = "reap"
    processes: tuple[MarkedProcess, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Hold(Action):
    """Record a deployment that cannot start now as Pending, saying why."""

    verb = "pending"
    entry: Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class Reject(Action):
    """A deployment whose manifest was invalid from the start: a Pending record says why."""

    verb = "reject"


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkSpec(Action):
    """Flag a running deployment whose manifest broke (or was fixed)."""

    verb = "mark-spec"
    valid: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Conflict(Action):
    """The name belongs to another manifest set: report, touch nothing."""

    verb = "conflict"


# Every concrete action: what the executor must handle (mypy checks each `match` is whole).
AnyAction = (
    Start
    | Restart
    | Replace
    | Stop
    | Promote
    | Park
    | Preempt
    | Update
    | Fail
    | MarkReady
    | Adopt
    | Resync
    | Release
    | Reap
    | Hold
    | Reject
    | MarkSpec
    | Conflict
)
