"""What a pass will do: frozen actions, each with a human ``reason``.

The planner returns them; the executor applies them and decides nothing. What holds
for every action of a kind is stated on its class, once (kubelet's podActions carry
their own facts), never in tables keyed by the class elsewhere:

``verb``
    The word logs, events and ``reconcile plan`` use.
``order``
    Where a plan sorts it (lowest first): reaping and releasing before teardowns,
    teardowns before starts (which need what they free), waits last.
``tears_down``
    It may wait out an engine's grace period: a pass runs these concurrently.
``frees``
    It can give up the record's devices and port this round, so a start or
    preemption weighed in the same plan may count on them (see :meth:`Action.frees_now`).
``plan_class``
    How ``reconcile plan`` shows it (terraform-style, see ``cli/render/planview.py``).

``Action`` itself states none of them (it is abstract by design): every concrete
class states all of them in its own body, so a subclass such as :class:`Replace`
never inherits its parent's by accident (tests/core/test_actions.py checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from controller.core.manifest.names import base_name
from controller.core.manifest.specs import Entry
from controller.core.state import ExitInfo, Instance, MarkedProcess, Phase, ProcessRef

# `reconcile plan`'s classes of change (a deployment no action touches is "unchanged").
PlanClass = Literal["create", "in-place", "replace", "destroy", "restart", "wait"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    verb: ClassVar[str]
    order: ClassVar[int]
    tears_down: ClassVar[bool]
    frees: ClassVar[bool]
    plan_class: ClassVar[PlanClass]
    name: str
    reason: str

    def describe(self) -> str:
        return f"{self.verb} {self.name}: {self.reason}"

    def frees_now(self) -> bool:
        """This action gives up the record's devices this round (its teardown runs first)."""
        return self.frees


@dataclass(frozen=True, kw_only=True, slots=True)
class Start(Action):
    """Reserve devices and a port, then spawn (a new or Pending deployment)."""

    verb = "start"
    order = 14
    tears_down = False
    frees = False
    plan_class = "create"
    entry: Entry
    devices: tuple[str, ...]
    port: int
    extra_ports: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart(Action):
    """Respawn in place: same devices and port, new nonce (after a crash or back-off)."""

    verb = "restart"
    order = 13
    tears_down = False
    frees = False
    plan_class = "restart"
    entry: Entry
    restarts: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Stop(Action):
    """Tear the instance down completely, then drop its record."""

    verb = "stop"
    order = 6
    tears_down = True
    frees = True
    # Annotated: unannotated, mypy would take "destroy" as the type Replace must keep.
    plan_class: ClassVar[PlanClass] = "destroy"
    # A replica scaled away: its requests in flight end first while the other replicas
    # take the new ones (a scale-down comes under load, and cut the answers it streamed).
    drain: bool = False
    # The deployment is no longer declared here: what is kept for it between passes (the
    # autoscaler's count) goes with its record, as an HPA's state goes with its Deployment.
    undeclared: bool = False
    # A drain's eviction: the deployment is still declared, so its record stays, Pending
    # and holding nothing, saying why (a dropped one made the gateway answer 404 for its
    # model, and `status` forget it, until the next pass wrote it again).
    evict: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Replace(Stop):
    """The spec changed: tear down now, a later round starts the new one."""

    verb = "replace"
    order = 4
    tears_down = True
    frees = True
    plan_class = "replace"
    fields: tuple[str, ...] = ()
    # The spec the new one runs (None: the same, moved): what must be on the node before
    # a running engine is stopped for it (its image: a typo in a tag stops nothing).
    entry: Entry | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Promote(Action):
    """RollingUpdate: ``<name>@next`` is Ready (or ``name``'s record is gone): the gateway
    moves to it, the old instance drains its in-flight requests and stops, and the new
    record takes the deployment's name. Each step is safe to repeat after a crash."""

    verb = "promote"
    order = 5
    tears_down = True
    frees = False  # the name goes on holding (what `<name>@next` was given): nothing to count on
    plan_class = "replace"  # the new instance takes over, the old one goes


@dataclass(frozen=True, kw_only=True, slots=True)
class Park(Action):
    """OnDemand: tear down whatever runs (idle, or swapped out) and record it ``Idle``."""

    verb = "park"
    order = 8
    tears_down = True
    frees = True
    plan_class = "destroy"  # the engine goes, an Idle record stays
    entry: Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class Update(Action):
    """Only what the running engine never sees changed (readiness, restartPolicy,
    stopGracePeriodSeconds; labels, aliases, idleTimeout and the other facts a spec's
    hash leaves out; the manifests' commit): rewrite the record in place, no restart."""

    verb = "update"
    order = 11
    tears_down = False
    frees = False
    plan_class = "in-place"
    entry: Entry
    fields: tuple[str, ...] = ()
    # Only the manifests' commit moved: the pass records it; `plan` counts no change.
    revision_only: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Preempt(Action):
    """Stop a running engine so a deployment of higher priority fits; keep it Pending.

    The planner chose it (fewest, lowest, most recently started); the record stays,
    holding nothing, and a later pass starts it again when room returns.
    """

    verb = "preempt"
    order = 7
    tears_down = True
    frees = True  # the planner releases its devices where it decides it, before the start
    plan_class = "destroy"
    by: str
    priority: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Fail(Action):
    """Kill what is left of the instance and record the outcome.

    ``phase`` is BackOff (restart at ``retry_at``), Failed or Succeeded (devices released).
    """

    verb = "fail"
    order = 9
    tears_down = True
    frees = True  # when its phase holds nothing: see frees_now
    plan_class = "in-place"
    phase: Phase
    retry_at: datetime | None = None
    restarts: int = 0
    exit: ExitInfo | None = None

    def frees_now(self) -> bool:
        """Failed and Succeeded give the devices up; BackOff keeps them for the restart."""
        return not self.phase.holds_resources


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkReady(Action):
    """The readiness probe passed: the engine serves (the gateway routes to it)."""

    verb = "ready"
    order = 12
    tears_down = False
    frees = False
    plan_class = "in-place"


@dataclass(frozen=True, kw_only=True, slots=True)
class Adopt(Action):
    """A reservation whose maker died: its engine is running, take it over."""

    verb = "adopt"
    order = 2
    tears_down = False
    frees = False
    plan_class = "in-place"
    ref: ProcessRef


@dataclass(frozen=True, kw_only=True, slots=True)
class Resync(Action):
    """The backend moved or restarted the engine on its own (Ray after a node loss or a
    crash): write where it runs now; a new engine counts a restart and is probed again."""

    verb = "resync"
    order = 3
    tears_down = False
    frees = False
    plan_class = "in-place"  # the record takes what the backend reports (node, port)
    instance: Instance
    restarted: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Release(Action):
    """Drop a record that holds no process (dead reservation, removed Pending, ...)."""

    verb = "release"
    order = 1
    tears_down = False
    frees = True
    plan_class = "destroy"
    nonce: str | None = None
    undeclared: bool = False  # as Stop's: the deployment's kept count goes with the record
    # A port move (another process took the port of an engine not running): the record
    # stays, Pending with this restart count, which the next placement takes up.
    restarts: int | None = None
    afresh: str = "another port"  # what such a move's placement looks for (its event says)


@dataclass(frozen=True, kw_only=True, slots=True)
class Reap(Action):
    """Kill marker processes no record accounts for (invariant 3)."""

    verb = "reap"
    order = 0
    tears_down = False  # a kill with no grace period to wait out
    frees = False  # its processes hold nothing any record (or the ledger) counts
    plan_class = "destroy"
    processes: tuple[MarkedProcess, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Pull(Action):
    """The deployment's model files are not in the cache: pull them before placement.

    It holds no device and no port. ``spawn``: no pull of ``key`` runs and none waits out
    a back-off, so start one (once per key in a plan). ``record``: write the deployment's
    ``Pulling`` record; a rolling update's pull writes none (the old instance serves on).
    """

    verb = "pull"
    order = 15
    tears_down = False
    frees = False
    plan_class = "create"
    entry: Entry
    key: str
    spawn: bool
    record: bool = True
    waiting: tuple[str, ...] = ()  # every deployment of this plan that waits for the key


@dataclass(frozen=True, kw_only=True, slots=True)
class Fetch(Action):
    """What the deployment runs from is not on the node (``Observed.fetching``: its
    container image): the backend fetches it before placement. It holds no device and no
    port and preempts nobody: a fetch that fails tears no healthy engine down. The record
    is ``Pulling`` meanwhile, or backs off holding nothing when the fetch failed."""

    verb = "pull-image"
    order = 16
    tears_down = False
    frees = False
    plan_class = "create"
    entry: Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class Hold(Action):
    """Record a deployment that cannot start now as Pending, saying why."""

    verb = "pending"
    order = 17
    tears_down = False
    frees = False
    plan_class = "wait"
    entry: Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class Reject(Action):
    """A deployment whose manifest was invalid from the start: a Pending record says why."""

    verb = "reject"
    order = 18
    tears_down = False
    frees = False
    plan_class = "wait"  # a new deployment whose spec is invalid: it cannot start, and why


@dataclass(frozen=True, kw_only=True, slots=True)
class MarkSpec(Action):
    """Flag a running deployment whose manifest broke (or was fixed)."""

    verb = "mark-spec"
    order = 10
    tears_down = False
    frees = False
    plan_class = "in-place"
    valid: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Conflict(Action):
    """The name belongs to another manifest set: report, touch nothing."""

    verb = "conflict"
    order = 19
    tears_down = False
    frees = False
    plan_class = "wait"


@dataclass(frozen=True, kw_only=True, slots=True)
class Probed(Action):
    """A Ready engine's liveness count moved (a failure under the threshold, or an
    answer after failures): the record keeps ``failures`` in a row, no restart yet."""

    verb = "liveness"
    order = 20  # a record write that waits for nothing and nothing waits for
    tears_down = False
    frees = False
    plan_class = "in-place"
    failures: int


@dataclass(frozen=True, kw_only=True, slots=True)
class HoldRestart(Action):
    """A BackOff engine whose restart is due on a drained node: the record keeps its lease
    and says the drain holds the restart (its "restart now" would be a lie until uncordon)."""

    verb = "held"
    order = 21  # a record write, as Probed's
    tears_down = False
    frees = False
    plan_class = "wait"


@dataclass(frozen=True, kw_only=True, slots=True)
class HoldChange(Action):
    """A running engine whose spec changed (or whose restart was asked) on a drained node:
    its replacement would stop it and start nothing until uncordon, so it serves on with
    its old spec and its record's message says the drain holds the change (Kubernetes'
    cordon leaves a Deployment's old Pod serving too). ``over``: the hold has ended
    (uncordon, the edit undone) while the engine runs on: those words go."""

    verb = "held-change"
    order = 22  # a record write, as HoldRestart's
    tears_down = False
    frees = False
    plan_class = "wait"
    over: bool = False


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
    | Pull
    | Fetch
    | Hold
    | HoldRestart
    | HoldChange
    | Reject
    | MarkSpec
    | Conflict
    | Probed
)


def only_starts_new(actions: Sequence[Action], present: Iterable[str]) -> bool:
    """Every action starts a deployment of which no record exists (``present``: the
    records' names): a plan that stops, replaces and changes nothing already there. What
    a pass run before the manifests' folder has settled may apply (daemon/loop.py): a
    multi-file edit still landing can make it start early, never stop what it keeps."""
    have = {base_name(name) for name in present}
    # a Fetch: such a start waiting for its image, holding nothing (as its Start would)
    return all(isinstance(a, Start | Fetch) and base_name(a.name) not in have for a in actions)
