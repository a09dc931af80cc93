"""The seam between a pass and where engines run: one ``Backend`` protocol.

The reconciler, the executor and the observer see only this protocol, never a
concrete backend, and are handed one from outside (the CLI or the daemon picks
it). A backend runs one engine instance per record and answers for it by
``ProcessRef`` (identity, invariant 6) and by the instance nonce (the marker).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from controller.core.devices.inventory import Inventory
from controller.core.imagepulls import ImageWait
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.pulls import PullView
from controller.core.render import Rendered
from controller.core.state import ContainerRef, Instance, MarkedProcess, ProcessRef, Record

# Inherited variables an engine must never see: they would undo the device fence
# or make it look like another instance.
SCRUBBED = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def engine_env(rendered: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine runs with: ours, scrubbed, then the rendered one on top."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_") and k not in SCRUBBED
    }
    env.update(rendered)
    return env


def engine_path(program: str, rendered: Mapping[str, str]) -> str | None:
    """Where an engine's start looks for ``program``, for its "cannot exec" hint: the PATH
    its environment (``engine_env``) holds, and whose that is; None for a path (a name
    with a slash is exec'd as is, no PATH searched)."""
    if "/" in program:
        return None
    if "PATH" in rendered:
        return f"searched spec.env's PATH: {rendered['PATH']}"
    if "PATH" in os.environ:  # what engine_env passes on
        return f"searched reconcile's own PATH (spec.env's PATH sets another): {os.environ['PATH']}"
    return f"the engine's environment has no PATH: searched the default, {os.defpath}"


@dataclass(frozen=True, slots=True)
class Held:
    """Why a running engine keeps serving rather than being stopped for its new spec
    (``Backend.prepared``), or a start waits for its image (``Backend.fetch``)."""

    why: str
    failed: bool = False  # the new spec cannot start as things are (its image did not pull)
    pending: bool = False  # nothing will fetch it (pullPolicy Never): Pending until it is here


@dataclass(frozen=True, kw_only=True, slots=True)
class StartRequest:
    """Everything a backend needs to start one instance of a reservation."""

    entry: Entry
    record: Record  # the reservation: name, nonce, devices, port, extra ports
    rendered: Rendered  # rendered for the reservation's devices and port
    log_path: Path  # on this host; a cluster backend keeps the log on the engine's node


@dataclass(frozen=True, slots=True)
class CommandLine:
    """What a start runs, as `reconcile plan` shows it (``Backend.command_line``): the
    argv (a process's own, a container's runtime's whole `run`) with its secrets hidden
    (``redact.redact_args``), and the names of the variables it is given, never a value."""

    argv: tuple[str, ...]
    env: tuple[str, ...]
    # Why its exec would fail, with the next move (a process whose program is not where
    # its start looks); None: it would exec, or this backend cannot tell from here.
    unrunnable: str | None = None


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How an engine ended, when the backend saw it end (else unknown: None)."""

    code: int | None
    signal: int | None
    oom_killed: bool = False  # a container's runtime said the OOM killer ended it


# ``Backend.previous_exit``'s word for a run whose code nothing will ever say.
NOT_KEPT = ExitStatus(None, None)


class Puller(Protocol):
    """Where a spec.source is pulled, as the pass sees it (DESIGN.md "Model files").

    A pull holds no device and no port; it outlives the pass that started it, and the
    next pass finds it again by cache key. The planner reads only :meth:`observe`, a
    pure read (``reconcile plan``); the pass then calls :meth:`settle` to keep what it saw.
    """

    def observe(self) -> dict[str, PullView]:
        """Each cache key known here: cached, being pulled (with progress), failed."""
        ...

    def settle(self) -> None:
        """Write down what the last :meth:`observe` saw (a pass's act side, never plan)."""
        ...

    def start(self, entry: Entry, waiting: tuple[str, ...]) -> str:
        """Start (or resume) the pull of ``entry``'s source; where it runs, for the journal."""
        ...

    def model_path(self, entry: Entry) -> str | None:
        """What ``{model}`` names for ``entry`` (None: no source, or not pulled yet)."""
        ...

    def used(self, entry: Entry, at: datetime) -> None:
        """An engine started on the entry's files (``reconcile models`` shows it)."""
        ...


class Backend(Protocol):
    name: str  # a core.backendnames name: written into records and shown by status
    # How many launches a pass may run at once: a cluster's (placing an actor, starting its
    # worker) take seconds each; a local spawn is a fork and exec.
    launch_concurrency: int
    # What differs between backends is asked by property, never by comparing names.
    # True: the backend picks node, port and devices itself (a cluster), so an event says
    # where; False: the planner's exact devices and port are where the engine runs.
    places_engines: bool
    # True: engines are this node's child processes, so a pidfd wakes the daemon the moment
    # one exits; False: they run elsewhere and a resync pass sees what happened.
    exits_watchable: bool
    # True: spec.nodeSelector chooses among the backend's own nodes, by their labels, when
    # it places (a cluster), so every deployment is this controller's to run; False: it
    # is matched against this node's node.yaml labels, and a deployment that does not
    # match is another node's (a fleet's share, decided before planning).
    selects_nodes: bool

    def puller(self, state_dir: Path, stall_seconds: float) -> Puller:
        """Where this backend's engines get their model files (see :class:`Puller`)."""
        ...

    def devices(self) -> Inventory | None:
        """The devices as they are now (a cluster's nodes come and go); None: configured."""
        ...

    def launch(self, launch: StartRequest) -> Instance:
        """Start the instance; where it runs (a cluster may choose node, port, devices)."""
        ...

    def command_line(self, launch: StartRequest) -> CommandLine | None:
        """What ``launch`` would run, for `reconcile plan`: nothing is started, an image
        is looked at, never pulled. None: the engine's node renders it (a cluster)."""
        ...

    def refresh(self, records: Iterable[Record]) -> None:
        """Look at every record's instance at once, before a pass judges them (batched)."""
        ...

    def instance_of(self, rec: Record) -> Instance | None:
        """Where the backend runs ``rec``'s instance now, if it places engines itself."""
        ...

    def container_of(self, rec: Record) -> ContainerRef | None:
        """The container the engine of ``rec`` (its nonce) runs in, as its runtime's labels
        say (None: a process, or none): what a record made by adopting it must keep."""
        ...

    def prepared(self, spec: DeploymentSpec, running: Record) -> Held | None:
        """Before ``running``'s engine is stopped for ``spec`` (a recreate): None when what
        ``spec`` runs from is on its node (its container image; on a cluster, on each node
        the new one may land on: the one ``running`` frees among them), else why the
        running one keeps serving meanwhile (its image being pulled; why it cannot be:
        ``failed``)."""
        ...

    def fetching(self, spec: DeploymentSpec, starting: int = 1, ahead: int = 0) -> ImageWait | None:
        """Why a start of ``spec`` waits for what it runs from (its container image not on
        the node yet, or its pull failed), else None. A look only: nothing started. The
        planner sees it abstractly (``Observed.fetching``): such a start holds nothing and
        preempts nobody until it is there. ``starting``: how many of its instances this
        pass may place (a cluster looks on every node one may land on when they may not
        all fit in the room there is: those with room, and those where one lands by
        preempting; the wait's ``room`` is how many the nodes with room that hold it
        take meanwhile). ``ahead``: the devices this pass's other starts placed before
        these (the planner's order: a higher priority, or the same and a name sorted
        first) may take from that room: the room there is is the pass's, not each
        deployment's."""
        ...

    def image_nodes(self, spec: DeploymentSpec) -> frozenset[str]:
        """The nodes (as a cluster's devices name them: ``Device.node``) the last
        ``fetching`` found ``spec``'s image on: the plan takes their devices first, and
        the launch goes where it put them. Empty: one node, or none known."""
        ...

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        """Fetch what ``fetching`` found missing (start its pull): None when it is there
        now, else the wait, or why it could not be fetched (``failed``: said once)."""
        ...

    def drop_unused_pulls(self, specs: Iterable[DeploymentSpec]) -> int:
        """Forget the ended image pulls that none of ``specs`` (every spec a pass knows)
        runs from; how many (a pass's act side, never plan)."""
        ...

    def drop_unused_env_files(self, records: Callable[[], Iterable[Record]]) -> int:
        """Remove this set's container env files (spec.env's values) that no start in
        flight reads (a start SIGKILLed left its own); how many. ``records``: every record
        (of any set), read once the files are listed."""
        ...

    def late_exit(self, rec: Record) -> ExitStatus | None:
        """How ``rec``'s ended engine exited, where its pass could not read it then (a
        container's runtime that did not answer) and it can now; its container then
        removed. None: nothing more to read (the common case, asked of no runtime)."""
        ...

    def previous_exit(self, rec: Record) -> ExitStatus | None:
        """How the run before ``rec``'s own (``rec.unread_exit``) exited, read from its
        container's State once its runtime answers; its container then removed.
        ``NOT_KEPT``: nothing will ever say it (its container removed meanwhile); None:
        not yet (the runtime does not answer), or no such run."""
        ...

    def unplaceable(self, spec: DeploymentSpec) -> str | None:
        """Why the backend cannot place ``spec`` now (a cluster short of GPUs, or with no
        node its ``nodeSelector`` matches), else None."""
        ...

    def alive(self, ref: ProcessRef | None) -> bool:
        """Invariant 6: True only for the very process the ref names."""
        ...

    def exit_of(self, ref: ProcessRef) -> ExitStatus | None: ...

    def scan(self) -> list[MarkedProcess]:
        """Every live process carrying one of our markers (adoption, orphans)."""
        ...

    def strangers(self) -> list[MarkedProcess]:
        """Live engines marked with this state dir's path and another state dir's id: a
        disk not mounted, a folder replaced. Not ours to adopt or reap; a pass refuses to
        act while one runs (``reconciler/replaced.py``). The model pulls of such a state dir
        too, where the backend runs them here (``MarkedProcess.pull``)."""
        ...

    def teardown(self, rec: Record) -> None:
        """Stop the record's instance entirely (invariant 10) and wait for its devices.
        NotProvenOurs: a live engine this backend may not prove ours, not signalled."""
        ...

    def signal_stop(self, rec: Record) -> bool:
        """Begin ``rec``'s teardown without waiting: its stop signal to the whole group
        (invariant 10). True: begun here, and finished by ``teardown`` once ``stopped``
        or its grace is over; False: nothing sent, this instance stops by ``teardown``
        alone (a container, a cluster's actor). NotProvenOurs, as ``teardown``."""
        ...

    def stopped(self, rec: Record) -> bool:
        """Nothing of the instance a ``signal_stop`` began to stop runs any more (its
        group, every process carrying its marker and its cgroup's members are gone)."""
        ...

    def remains(self, rec: Record) -> bool:
        """Something of ``rec``'s engine runs though its leader is dead (a local engine's
        cgroup member that left its group and dropped its marker): the engine's port is
        not another process's while it does, and its teardown gives it the grace."""
        ...

    def sweep(self, nonce: str | None, ref: ProcessRef | None = None) -> int:
        """Kill whatever still carries the nonce's marker; how many were killed.
        NotProvenOurs, as ``teardown``, for a live ``ref`` not proven ours."""
        ...

    def prove_ours(self, rec: Record) -> None:
        """Signal nothing; NotProvenOurs where ``teardown`` would be refused now: what a
        gateway drain asks first (a drained engine whose stop is refused serves on)."""
        ...

    def kill(self, ref: ProcessRef) -> None: ...

    def listening_ports(self) -> frozenset[int]:
        """Ports something listens on where engines run (placement avoids them)."""
        ...

    def port_bindable(self, port: int) -> bool:
        """A bind probe: False when a socket (maybe not yet listening) holds the port."""
        ...

    def log_since(self, rec: Record, offset: int) -> tuple[bytes, int] | None:
        """The engine's log from byte ``offset`` and the next offset (None: no log found)."""
        ...

    def log_tail(self, name: str, count: int) -> list[str]:
        """The last ``count`` lines the deployment's current run wrote."""
        ...

    def runtime_log(self, rec: Record) -> list[str] | None:
        """The command line that prints the output of ``rec``'s engine where its log file
        no longer gets it: a container whose runtime's `run`, which streamed it there,
        ended while the container runs on (killed by hand, an OOM kill of that client
        alone); None: the log file has it."""
        ...
