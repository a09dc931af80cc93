"""Pure state values: records, process identities, and one pass's observations.

No I/O here: the planner imports these. The record store lives in
:mod:`controller.store.instances.records`, the observing in :mod:`controller.reconciler.observe`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from controller.core.devicefaults import DeviceFault, Measured
from controller.core.elapsed import BootClock, elapsed
from controller.core.imagepulls import ImageWait
from controller.core.manifest import backendnames
from controller.core.manifest.quantity import format_age
from controller.core.pulls import PullView

# 2: the rendered facts (activation, idle_timeout, ready_deadline_seconds, models,
# device_count) are fields, and the spec document is ``stored_spec``. Version 1 files are
# still read: their facts are derived from their spec (store/instances/recordjson.py).
# 3: ``ready_boot`` and ``idle_boot``, the boot clock beside ``ready_at`` and ``idle_since``,
# so a wall-clock step neither delays a wake nor skips the back-off's reset (docs/design.md,
# "Clock steps"). Version 2 files are still read (without them: the wall clock decides).
VERSION = 3
# 4: ``unread_exit``, a run restarted before its runtime said its exit code. Only a record
# holding one is written as version 4 (``to_json``): every other stays a version-3 file,
# which the releases before it read; to them a version-4 record is a newer one, left in
# place and named, never quarantined (its engine is not lost to them, only not managed).
NEWEST_VERSION = 4
START_TIME_TOLERANCE = 0.05  # seconds; a start time is exact to a clock tick
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT


# How a BackOff record's message ends (core/planner/lifecycle.retry writes it): when the
# restart is due, as the pass saw it ("; restart in 20s", "; restart now"), or that a
# drain holds it ("; restart held: node drained by … until …"); and what a view says once
# that time has passed and no pass has restarted it yet.
RESTART_HELD = "; restart held: "
_RESTART_WHEN = re.compile(r"; restart (?:now|in [0-9][0-9.]*s)$|; restart held: .*\Z", re.S)
RESTART_DUE = "restart due: the next pass starts it"
# How a spec-invalid mark's message begins (core/planner/records: "spec invalid (engine left
# running): manifests/a.yaml:3: ..."): a view drops one its set's last pass did not read.
SPEC_INVALID = "spec invalid ("
# How a running record's message says a drain holds its spec change (a HoldChange):
# "spec.args changed: held: node drained by … until …".
CHANGE_HELD = ": held: "


# How a cluster record's message says its cluster did not answer (the daemon writes it:
# reconciler/unreachable.py), the phase left as the last look saw it: "state unknown since
# 2026-12-06 17:00:00 UTC: <why, the next move>". Views say that phase is in doubt.
STATE_UNKNOWN = "state unknown since"
UNKNOWN_SINCE = "%Y-%m-%d %H:%M:%S UTC"


def unknown_mark(since: datetime, why: str) -> str:
    """The message of a cluster record whose cluster did not answer from ``since``."""
    return f"{STATE_UNKNOWN} {since.astimezone(UTC).strftime(UNKNOWN_SINCE)}: {why}"


# A crashed engine's back-off (Kubernetes' CrashLoopBackOff): 10 s, doubling to 300 s. Here,
# not in the planner that applies it: the gateway reads the cap too (a 503's Retry-After),
# and it imports no planner (pydantic, the specs) at its start.
BACKOFF_FIRST = 10.0
BACKOFF_MAX = 300.0


def backoff(restarts: int) -> float:
    """Delay before restart number ``restarts + 1``: 0, 10, 20, 40 ... 300 s (a failed
    pull's retry too: ``status`` reads its due time without the planner)."""
    if restarts <= 0:
        return 0.0
    return float(min(BACKOFF_FIRST * 2.0 ** (restarts - 1), BACKOFF_MAX))


def backoff_cause(message: str) -> str:
    """A BackOff record's message without its "; restart in 20s" (why it backs off)."""
    return _RESTART_WHEN.sub("", message)


class Phase(StrEnum):
    PENDING = "Pending"
    RESERVED = "Reserved"
    STARTING = "Starting"
    READY = "Ready"
    BACKOFF = "BackOff"
    FAILED = "Failed"
    SUCCEEDED = "Succeeded"
    TERMINATING = "Terminating"
    IDLE = "Idle"  # an OnDemand deployment with no engine, waiting for a request
    PULLING = "Pulling"  # its model files are being pulled into the cache, before placement

    @property
    def holds_resources(self) -> bool:
        """Pending, Failed, Succeeded, Idle and Pulling records hold no device and no port
        (a 40 GB download must not keep a GPU idle)."""
        return self not in (
            Phase.PENDING,
            Phase.FAILED,
            Phase.SUCCEEDED,
            Phase.IDLE,
            Phase.PULLING,
        )


# Phases nothing moves a record out of without the user (a change, room, a fix): a wait
# (`up --wait`, `restart`) that sees one says so and ends instead of waiting on.
STUCK = (Phase.PENDING, Phase.FAILED)

# Phases whose engine has exited (a crash waiting out its back-off, a failed or finished
# run; its group reaped): a record's ``ref`` names the last engine, which no longer runs.
EXITED = (Phase.FAILED, Phase.SUCCEEDED, Phase.BACKOFF)


# Records and their parts are plain values: the store reads and writes their JSON
# (store/instances/recordjson.py), and no verb that reads records needs pydantic.


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessRef:
    """A process identity: pid alone lies after pid reuse, (pid, start time) does not."""

    # 0 (our own group to killpg), negatives and past Linux's PID_MAX_LIMIT are no process:
    # a record holding one is quarantined, never signalled.
    pid: int
    start_time: float
    # Ticks after boot (and which boot): unlike start_time, unmoved when NTP steps the
    # clock, so a clock step never makes every engine look dead.
    start_ticks: int | None = None
    boot_id: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.pid <= PID_MAX:
            raise ValueError(f"pid must be in 1..{PID_MAX}, not {self.pid}")

    def same_process(self, other: ProcessRef) -> bool:
        if self.pid != other.pid:
            return False
        if None not in (self.start_ticks, other.start_ticks, self.boot_id, other.boot_id):
            return self.start_ticks == other.start_ticks and self.boot_id == other.boot_id
        return abs(self.start_time - other.start_time) <= START_TIME_TOLERANCE


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerRef:
    """The container an engine runs in (DESIGN.md "Engines in containers"): the runtime
    that runs it, its id, the image as the manifest wrote it and the digest it was pulled
    by (else the local image id). The record's ``ref`` is its main process as seen here."""

    runtime: str
    id: str
    image: str
    digest: str = ""


# Why a cluster engine's exit code is unknown: its actor (and the engine with it) is gone.
ACTOR_GONE = "its actor is gone: exit code unknown"
# Why a container engine's is: its `run` said none (killed, or the runtime's own failure).
# Never our child, so "not our child" said nothing of why.
RUN_UNSAID = "its container's run said no exit code"
# Why a container engine ended, when its runtime says the kernel's OOM killer ended it
# (Kubernetes' word for a container's last state).
OOM_KILLED = "OOMKilled"
# Why a start ended before any engine ran: its program's exec failed (not found, not
# executable; the record's message says which, and the next move). Its code is the exit of
# the process that tried (127, as a shell's). A release before this one reads the reason
# as any other string ("exited with code 127"): the record stays a version-3 file.
CANNOT_EXEC = "CannotExec"


@dataclass(frozen=True, kw_only=True, slots=True)
class ExitInfo:
    code: int | None = None
    signal: int | None = None
    at: datetime
    reason: str = ""

    def __str__(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.reason == CANNOT_EXEC:
            code = "" if self.code is None else f" (exit code {self.code})"
            return f"its program could not be exec'd{code}: no engine ran"
        if self.code is not None and self.reason == OOM_KILLED:
            return f"exited with code {self.code} (OOMKilled: out of memory)"
        if self.code is not None:
            return f"exited with code {self.code}"
        if self.reason == ACTOR_GONE:  # not a crash of the engine's own: say what ended
            return "ended with its actor (its node or the cluster lost, or the actor killed)"
        if self.reason == RUN_UNSAID:
            return "exited (code unknown: its container's `run` said none)"
        return "exited (code unknown: not our child)"


@dataclass(frozen=True, kw_only=True, slots=True)
class UnreadExit:
    """The run before a record's own, restarted while its exit code was unknown (its
    runtime did not answer: ``exit``): its container, kept with its exit file, is read
    and removed once the runtime answers, and its code becomes the record's last exit
    (Kubernetes' ``lastState.terminated``) where no later exit took its place
    (``reconciler/lateexits.py``)."""

    nonce: str  # that run's: its exit file's name
    container: ContainerRef
    exit: ExitInfo  # as the pass that saw it end recorded it


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeConfig:
    """A readiness or liveness check, kept in the record so any later pass can probe."""

    http: tuple[tuple[str, str | None], ...] = ()  # (path, body must contain)
    tcp: bool = False
    period_seconds: float = 2.0
    # `completion: {}`: POST a one-token request to this path (the recipe's
    # /v1/chat/completions or /v1/completions) for `model`; healthy on a 200 with a choice.
    completion: str | None = None
    model: str = ""
    timeout_seconds: float = 1.0
    failure_threshold: int = 1  # liveness: failures in a row that restart the engine
    # No API key: the prober finds the engine's when it probes (core/engines/apikey.py),
    # so no record holds one (DESIGN.md "Secrets").

    @property
    def kind(self) -> str:
        """What `describe` and events call it: `GET /health`, `tcp`, `completion ...`."""
        if self.completion:
            return f"completion (POST {self.completion})"
        if self.http:
            return f"GET {self.http[-1][0]}"
        return "tcp" if self.tcp else "exec"


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    version: int = VERSION
    name: str
    owner: str
    source: str = ""
    spec_hash: str = ""
    # The spec document as the manifest spelled it: the store's, for the planner's diff
    # (which fields changed) and `describe`. Every other reader takes the typed facts
    # below, rendered once when the record is made, so the gateway and the daemon can
    # never read a field two ways (the gateway once waited 600 s for an engine the
    # daemon killed at its recipe's 120 s).
    stored_spec: dict[str, Any] = field(default_factory=dict)
    spec_valid: bool = True
    activation: Literal["Always", "OnDemand"] = "Always"
    idle_timeout: float | None = None  # seconds without a request before an OnDemand stops
    # Seconds an engine has to get Ready (spec, else recipe): the daemon kills at it, the
    # gateway holds a request for it. None: no valid spec (a rejected manifest).
    ready_deadline_seconds: float | None = None
    models: tuple[str, ...] = ()  # routable model names: metadata.name, spec.model, aliases
    device_count: int = 0  # spec.devices.count: what a placing backend must find again
    # spec.affinity (else its engine's default): session keeps a session key's requests on
    # one replica, prefix a prompt's on the replica that served its beginning (the gateway)
    affinity: Literal["none", "session", "prefix"] = "none"
    # spec.fallbacks and spec.fallbackAfter (seconds): where the gateway sends a request this
    # deployment cannot take, and how long it waits for a Ready instance first
    fallbacks: tuple[str, ...] = ()
    fallback_after: float = 30.0
    # spec.autoscale.min is 0: at zero replicas the gateway wakes it with a request
    scale_to_zero: bool = False
    node: str  # local: the node name; ray: the Ray node id (full hex)
    backend: str = backendnames.LOCAL  # which backend judges this record (a name)
    engine: str = ""
    nonce: str | None = None
    ref: ProcessRef | None = None
    container: ContainerRef | None = None  # the engine's container (None: a process)
    reserved_by: ProcessRef | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    extra_ports: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    shareable: bool = False
    device_uuids: tuple[str | None, ...] = ()
    # Bytes held on EACH device (spec.devices.memory); None: whole devices. The ledger
    # counts it, so the record alone is the memory lease (no other registry).
    memory: int | None = None
    priority: int = 0  # spec.priority when placed: who may preempt it
    phase: Phase = Phase.PENDING
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    # The liveness probe (spec.livenessProbe, else the recipe's; None: none) and the
    # failures in a row it has counted since the engine was last Ready and answering.
    liveness: ProbeConfig | None = None
    liveness_failures: int = 0
    stop_signal: int = 15
    grace_seconds: float = 30.0
    restart_policy: str = "Always"
    reserved_at: datetime | None = None
    started_at: datetime | None = None
    ready_deadline_at: datetime | None = None
    ready_at: datetime | None = None
    ready_boot: BootClock | None = None  # the boot clock at ``ready_at`` (None: unknown)
    restarts: int = 0
    backoff_until: datetime | None = None
    last_exit: ExitInfo | None = None
    # The run before this one, restarted before its runtime said its code: still to read.
    unread_exit: UnreadExit | None = None
    revision: str | None = None
    message: str = ""
    idle_since: datetime | None = None  # Idle: parked then; a request after it starts it
    idle_boot: BootClock | None = None  # the boot clock at ``idle_since`` (None: unknown)
    # the manifest's metadata.labels: `-l key=value` selects on them
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """It holds its lease (devices, port), as its phase says, except a back-off that
        gave its lease back (:attr:`unleased_backoff`)."""
        return self.phase.holds_resources and not self.unleased_backoff

    @property
    def unleased_backoff(self) -> bool:
        """In back-off holding no device and no port: its start was refused before any
        engine ran (its image's pull failed: the launcher), so it keeps nothing idle while
        it waits, as a failed model pull does; its retry is placed afresh (a new lease
        from the ledger), never restarted in place. Every other back-off keeps its port."""
        return self.phase is Phase.BACKOFF and self.port is None

    @property
    def crash_looping(self) -> bool:
        """In back-off after a restart that never came up (a run that was Ready and then
        died is a crash the restart may well cure: not yet a loop). `--once` and `plan`
        exit 1 on it: it goes on by itself, never better, until someone looks."""
        return self.phase is Phase.BACKOFF and self.restarts > 0 and self.ready_at is None

    @property
    def exec_failed(self) -> bool:
        """In back-off because its last start could not exec its program (Kubernetes'
        RunContainerError): no engine ran, and none will until someone installs it or
        fixes the spec. `--once` and `plan` exit 1 on it; the retries go on meanwhile."""
        ended = self.last_exit
        return self.phase is Phase.BACKOFF and ended is not None and ended.reason == CANNOT_EXEC

    @property
    def on_demand(self) -> bool:
        """Started by the gateway on a request, stopped after ``idle_timeout`` without one."""
        return self.activation == "OnDemand"

    @property
    def on_cluster(self) -> bool:
        """A cluster backend's record: ``node`` is the cluster's node id, the pid and the
        log live on that node, and any node's backend judges it."""
        return backendnames.on_cluster(self.backend)

    @property
    def state_unknown(self) -> bool:
        """A cluster record its cluster did not answer for (``unknown_mark``): its phase
        is the last look's, not known now; the first pass that reaches it clears this."""
        return self.on_cluster and self.message.startswith(STATE_UNKNOWN)

    def unknown_since(self) -> datetime | None:
        """When a record ``state_unknown`` became so (None: known, or a mark not ours)."""
        if not self.state_unknown:
            return None
        stamp = self.message.removeprefix(STATE_UNKNOWN).lstrip().partition(": ")[0]
        try:
            return datetime.strptime(stamp, UNKNOWN_SINCE).replace(tzinfo=UTC)
        except ValueError:
            return None

    def elsewhere(self, node: str | None) -> bool:
        """A local record another node made: never judged here (its pids are not ours)."""
        return node is not None and not self.on_cluster and self.node != node

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the record leases: the engine's, then its internal ones."""
        return self.extra_ports if self.port is None else (self.port, *self.extra_ports)

    def message_at(self, now: datetime) -> str:
        """``message`` as true at ``now``: the pass wrote a BackOff's "restart in 20s" when
        it began, so a view counts it again from ``backoff_until`` (read an hour later
        from a cron pass's record, it still said 20s)."""
        cause = backoff_cause(self.message)
        if self.phase is not Phase.BACKOFF or self.backoff_until is None or cause == self.message:
            return self.message
        if RESTART_HELD in self.message.removeprefix(cause):  # a drain holds it: no countdown
            return self.message
        left = (self.backoff_until - now).total_seconds()
        when = f"restart in {format_age(math.ceil(left))}" if left > 0 else RESTART_DUE
        return f"{cause}; {when}"

    def released(self) -> Record:
        """This record giving its lease back: no device, no memory on one, no port. The
        one way to do it, so no path frees the devices and forgets the memory (a Failed
        record once kept ``memory`` with no device to hold it on)."""
        return replace(self, devices=(), device_uuids=(), memory=None, port=None, extra_ports=())

    def unmarked(self) -> Record:
        """This record as a pass that read no manifest leaves it to be shown: invariant 5
        kept it whole, so a spec-invalid mark on it names an earlier read's file (one the
        commit applied may not have), not one of this read."""
        if self.spec_valid:
            return self
        message = "" if self.message.startswith(SPEC_INVALID) else self.message
        return replace(self, spec_valid=True, message=message)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ready: bool
    detail: str


@dataclass(frozen=True, slots=True)
class MarkedProcess:
    """A live process carrying an instance marker ``<node>/<name>/<nonce>`` (or whose spawn
    note names one: ``noted``); ``owner``: the manifest set that started it (None: started
    by a version that did not say)."""

    ref: ProcessRef
    name: str
    nonce: str
    ppid: int
    owner: str | None = None
    # Found by its spawn note, not its marker: this user may not read its environment (it
    # is not dumpable). The variables the note kept; a note proves no process ours to
    # signal (only the marker does), so such an engine is adopted, never reaped.
    noted: bytes | None = None
    # The id of the state dir that started it (None: a version that did not say).
    state_id: str | None = None
    # A model pull process (its cache key), not an engine: ``name`` is a deployment that
    # waits for it. Only a pass's refusal beside another state dir's names one.
    pull: str | None = None


@dataclass(frozen=True, slots=True)
class Instance:
    """Where a backend that places engines itself (Ray) says an instance runs now.

    The planner compares it with the record, as opaque values: a difference means the
    backend moved or restarted the engine on its own, and the record must say so.
    ``ref`` is None while the backend is bringing the engine (back) up.
    """

    ref: ProcessRef | None
    node: str
    host: str
    port: int | None
    devices: tuple[str, ...]
    message: str = ""
    container: ContainerRef | None = None  # the container it runs in (None: a process)


@dataclass(frozen=True, slots=True)
class RecordView:
    """A record plus what this pass saw of its processes."""

    record: Record
    alive: bool = False  # the engine (ref) is alive with the recorded identity
    maker_alive: bool = False  # the reservation's maker still runs
    maker_here: bool = False  # ... and is the observing process: a pass of its that failed
    exit: ExitInfo | None = None  # how the engine ended, when it was our child
    probe: ProbeResult | None = None
    # The liveness answers no pass has counted yet, oldest first.
    liveness: tuple[ProbeResult, ...] = ()
    markers: tuple[MarkedProcess, ...] = ()  # live processes carrying this record's nonce
    # Its leader dead, a member of its engine's cgroup runs on (``Backend.remains``).
    remains: bool = False
    instance: Instance | None = None  # what a placing backend reports (None: local)
    # Seconds the engine has run by the boot clock (None: unknown, e.g. another host's):
    # a wall-clock step never moves it, so deadlines judge by it (docs/design.md).
    age: float | None = None


@dataclass(frozen=True, slots=True)
class Activation:
    """The gateway's demand for an OnDemand deployment (``<state>/activation/<name>.json``).

    Desired state, not a side channel: the planner reads it as input with ``now``.
    """

    last_request_at: datetime
    inflight: int = 0
    # Unloaded (the web page): parked now; the next request writes an activation anew.
    released: bool = False
    # The boot clock at ``last_request_at`` (None: an old file, or no boot clock): the
    # idle time is judged on it, so a wall-clock step parks nothing early or late.
    boot: BootClock | None = None

    def idle_for(self, now: datetime, clock: BootClock | None) -> float:
        """Seconds since the last request (``clock``: the boot clock now)."""
        return elapsed(now, self.last_request_at, clock, self.boot)


# A pass reads the boot clock, then the wall clock (and `drain` when asked): a busy host
# can run other work for a second between the two reads, and an end computed from both
# moved by it, so a held record's words changed from pass to pass. A wall-clock step
# shorter than this is not shown (the end is said to the second).
READ_SKEW = timedelta(seconds=2)


@dataclass(frozen=True, slots=True)
class Drain:
    until: datetime  # on the wall clock when it was asked: what people read
    reason: str = ""
    by: str = ""
    evict: bool = False
    # The ttl asked and the boot clock then (None: a file from before they were kept,
    # judged by ``until`` alone): the same boot, a drain ends ``ttl`` later by the boot
    # clock whatever the wall clock does; never later than ``ttl`` from now.
    ttl: float | None = None
    boot: BootClock | None = None

    @classmethod
    def asked(cls, now: datetime, ttl: float, boot: BootClock | None, **why: Any) -> Drain:
        """A drain asked now for ``ttl`` seconds (``why``: reason, by, evict)."""
        return cls(until=now + timedelta(seconds=ttl), ttl=ttl, boot=boot, **why)

    def remaining(self, now: datetime, clock: BootClock | None = None) -> float:
        """Seconds left (0 or less: over); ``clock``: the boot clock now."""
        if self.ttl is None:
            return (self.until - now).total_seconds()
        asked = self.until - timedelta(seconds=self.ttl)
        return self.ttl - elapsed(now, asked, clock, self.boot)

    def active(self, now: datetime, clock: BootClock | None = None) -> bool:
        return self.remaining(now, clock) > 0

    def ends(self, now: datetime, clock: BootClock | None = None) -> datetime:
        """When it ends on today's wall clock (``until`` moved by any step since)."""
        ends = now + timedelta(seconds=self.remaining(now, clock))
        # Within READ_SKEW of ``until`` is no step: the skew between the two clocks' reads.
        return self.until if abs(ends - self.until) < READ_SKEW else ends

    def said(self, now: datetime, clock: BootClock | None = None) -> str:
        """What holds a start, in a Pending record's words and a 503's alike."""
        by = f" by {self.by}" if self.by else ""
        why = f" ({self.reason})" if self.reason else ""
        until = self.ends(now, clock).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
        return f"node drained{by} until {until}{why}: run `reconcile uncordon` or wait"


@dataclass(frozen=True, slots=True)
class Observed:
    records: dict[str, RecordView] = field(default_factory=dict)
    # Devices and ports held by records this reconcile cannot read (unknown version).
    foreign_devices: dict[str, str] = field(default_factory=dict)  # device -> holder
    foreign_ports: dict[int, str] = field(default_factory=dict)
    orphans: tuple[MarkedProcess, ...] = ()  # marker processes matching no record
    listening: frozenset[int] = frozenset()  # ports foreign processes listen on
    # A manifest's own port some process listens on -> that process, in words, where this
    # node can see it (reconciler/observe.py: port_holders): what its Pending names.
    port_holders: Mapping[int, str] = field(default_factory=dict)
    drain: Drain | None = None
    # The kernel's boot clock as this pass began (None: none here): what a drain's ttl
    # and an idleTimeout count on, unmoved by wall-clock steps (core/elapsed.py).
    boot: BootClock | None = None
    # The node this pass runs on; records of other nodes are shown, never judged.
    node: str | None = None
    unreadable: frozenset[str] = frozenset()  # names whose record has an unknown version
    # Instance names of engines left running with no record here (name -> who holds it,
    # in words): another set's whose record is torn (its own set adopts it), or one found
    # by its spawn note that no pass adopted (none may reap it). None starts a namesake.
    spared: Mapping[str, str] = field(default_factory=dict)
    # `plan`'s view only: this set's engines whose record lies torn, which the pass adopts
    # before it plans (reconciler/strays.py): instance name -> the engine.
    adopting: Mapping[str, ProcessRef] = field(default_factory=dict)
    pulls: Mapping[str, PullView] = field(default_factory=dict)  # model cache key -> its pull
    # Deployment -> why its start waits for what the backend fetches before it can run
    # (a container image not on the node yet, or whose pull failed): such a start holds
    # nothing and preempts nobody until it is there (planner/pulling.py, a Fetch); but
    # the wait's ``room`` starts, placed into free room on nodes that hold it.
    fetching: Mapping[str, ImageWait] = field(default_factory=dict)
    # Deployment -> a cluster's nodes its image was found on (as its devices name them):
    # the plan takes their devices first, as a source's files' (``PullView.nodes``).
    images_on: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Devices NVML reported a critical fault on (devicefaults.py): nothing is placed there
    # and what holds one is moved, until `reconcile devices --clear`.
    unhealthy: Mapping[str, DeviceFault] = field(default_factory=dict)
    # spec hash -> the engine's measured peak GPU memory per device (store/side/measured.py)
    measured: Mapping[str, Measured] = field(default_factory=dict)
