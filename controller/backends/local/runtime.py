"""Process handles: spawn in a new session, identity by (pid, start time), teardown.

The local :class:`~controller.backends.base.Backend`: engines are processes on this
node; the planner and the executor only see :class:`ProcessRef` values and the protocol.

Teardown (invariant 10): the stop signal to the engine's process group, the grace
period, SIGKILL to the group, then SIGKILL to every process still carrying the
instance's ``RECONCILE_INSTANCE`` marker (a grandchild that left the group), and
only then does the caller drop the record and with it the devices. A live leader whose
environment (so its marker) this user may not read is not signalled at all: the teardown
raises NotProvenOurs and the caller keeps the record (invariant 3: no engine survives
without one; and only a process proven ours is signalled). Such an engine is found by
its spawn note (``store/instances/spawnnotes.py``) where its marker cannot be read: a
pass that lost its record adopts it; no note makes it ours to signal, so a sweep skips it.

Where this process may make cgroups (``host/cgroups.py``), each engine runs in its own,
named in its spawn note (or, where no note could be written, found by its name): the
stop signal goes to its members too, and the grace runs until the cgroup is empty,
the leader dead or not; then its teardown kills every member left (a child that left
the group and dropped the marker) and removes the cgroup, before the note goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from controller import failpoints
from controller.backends.base import (
    NOT_KEPT,
    CommandLine,
    ExitStatus,
    Held,
    StartRequest,
    engine_env,
    engine_path,
)
from controller.backends.local import execgate
from controller.core.devices.inventory import Inventory
from controller.core.engines.program import no_program
from controller.core.imagepulls import ImageWait
from controller.core.manifest import backendnames
from controller.core.manifest.names import instance_of
from controller.core.manifest.specs import DeploymentSpec
from controller.core.state import (
    ContainerRef,
    Instance,
    MarkedProcess,
    Phase,
    ProcessRef,
    Record,
)
from controller.errors import ContainerError, ExecFailed, NotProvenOurs, SpawnError
from controller.host import cgroups, ports, procpsutil, procscan, procstat
from controller.host.devices import wait_gpu_release
from controller.host.procs import identity, live_identity, process_alive, ref_of
from controller.host.procscan import EnvironScan
from controller.logsetup import get_logger
from controller.pull import launch
from controller.pull.host import HostPuller
from controller.redact import redact_args
from controller.store.config import stateid
from controller.store.instances import logfiles
from controller.store.instances.records import RecordStore
from controller.store.instances.spawnnotes import SpawnNote, SpawnNotes
from controller.store.models import modelcache
from controller.store.statedir import StateDir

if TYPE_CHECKING:
    from controller.backends.local.container import Wrapper
    from controller.host.containers import Runtime

log = get_logger("reconcile")

MARKER = "RECONCILE_INSTANCE"
STATE_MARKER = "RECONCILE_STATE"
# The state dir's id (``store/config/stateid.py``): the path alone is also that of another
# state dir at the same path (a disk not mounted), whose engines are not this one's.
STATE_ID_MARKER = "RECONCILE_STATE_ID"
# The manifest set (its owner) that started the engine: a pass tells its own unrecorded
# engines from another set's by this fact (an engine of an older version has none).
OWNER_MARKER = "RECONCILE_OWNER"
# What a spawn note keeps of an engine's environment: what a scan and an adoption read
# from it (found_in: the port and the devices), never a value of the spec's own.
MARKERS = (MARKER, STATE_MARKER, STATE_ID_MARKER, OWNER_MARKER)
NOTED = (*MARKERS, "PORT", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
SWEEP_TIMEOUT = 5.0
POLL = 0.01
# Seconds an empty engine cgroup no note names is left alone: one a spawn beside this
# pass made and has not yet moved its engine into (then noted) is not a leftover.
CGROUP_SETTLE = 60.0
ENVIRON_WAIT = 0.5  # seconds an empty /proc/<pid>/environ may mean "still exec'ing"
CLIENT_GRACE = 2.0  # seconds a dead container engine's `run` may take to remove it and end
# Seconds a pass waits for the status in the exit file of a dead container engine's
# `run` (one it did not start, or one it stopped): on a busy host the runtime's clean-up
# takes seconds. A `run` killed with its shell costs none (the file names the shell).
EXIT_FILE_WAIT = 10.0
CLIENTS_KEPT = 32  # ended `run`s whose exit is still kept for exit_of


class LocalBackend:
    name = backendnames.LOCAL
    launch_concurrency = 1  # a fork and exec: nothing to overlap
    places_engines = False  # the planner chose the devices and the port
    selects_nodes = False  # spec.nodeSelector is node.yaml's: a fleet's share
    exits_watchable = True  # our children: a pidfd (or a liveness check) sees them end

    def devices(self) -> Inventory | None:
        return None  # this node's inventory, resolved once from flags or discovery

    def puller(self, state_dir: Path, stall_seconds: float) -> HostPuller:
        """Pull processes on this host, into its model cache (engines run here too)."""
        return HostPuller(modelcache.cache_root(state_dir), state_dir, stall_seconds)

    def __init__(
        self,
        state_dir: Path,
        node: str,
        *,
        store: RecordStore | None = None,
        container_runtime: str | None = None,
        static_devices: bool = True,
        owner: str | None = None,
        log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES,
    ) -> None:
        """``owner``: the manifest set whose engines this backend starts (their marker
        says so); None for a start on no set's behalf (a Ray actor's node)."""
        procpsutil.check_supported()  # on a host with neither /proc nor psutil: say so now
        # Where the engines' log files live: the caller's store of this state dir, if any.
        self.store = store if store is not None else RecordStore(state_dir)
        self.state_dir = str(state_dir.resolve())
        self.node = node
        self.owner = owner
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self.exits: dict[int, ExitStatus] = {}
        self._environs = EnvironScan()  # remembers unmarked processes between scans
        self._pull_environs = EnvironScan()  # as it, for the pulls' marker
        self.notes = SpawnNotes(state_dir)
        self._wrapping = (container_runtime, static_devices)
        self.log_max_bytes = log_max_bytes  # node.yaml's logMaxBytes: a container's own log too
        # `podman run`s we reap, by their engine's pid: a run's exit status is its
        # container's, so an engine that dies has its code (the newest ended kept).
        self._clients: dict[int, subprocess.Popen[bytes]] = {}
        # The records' container engines -> the file their `run` writes its status to as
        # it ends: how a pass that is not the `run`'s parent reads an engine's code.
        self._exit_files: dict[ProcessRef, Path] = {}
        # Those Starting or Ready -> their container, whose runtime is asked (once) how it
        # ended where its `run` said no code: the exit a pass judges, and only that one.
        self._containers: dict[ProcessRef, ContainerRef] = {}
        self._asked: set[ProcessRef] = set()
        # Engine cgroups read from a process about to be killed, by nonce: its sweep
        # empties them where no note names them (``_learn_cgroup``).
        self._learned: dict[str, Path] = {}

    @functools.cached_property
    def containers(self) -> Wrapper:
        """spec.container engines: how they are wrapped (node.yaml's default runtime). Made
        at the first container, so a pass with none imports no container code (7 ms)."""
        from controller.backends.local.container import Wrapper

        runtime, static_devices = self._wrapping
        return Wrapper(
            self.state_dir, runtime, static_devices=static_devices, owner=self.owner,
            log_max_bytes=self.log_max_bytes,
        )  # fmt: skip

    # -- identity ------------------------------------------------------------

    def alive(self, ref: ProcessRef | None) -> bool:
        """Invariant 6: alive only if the pid exists AND started when the record says."""
        if ref is None:
            return False
        self._reap(ref.pid)
        return process_alive(ref)

    def exit_of(self, ref: ProcessRef) -> ExitStatus | None:
        """The exit status, known for engines this process spawned and for containers (a
        container's: its `run`'s, which ends just after its engine; a `run` this process
        did not start says it in its exit file; the runtime says the rest)."""
        self._reap(ref.pid)
        client = self._clients.get(ref.pid)
        if ref.pid not in self.exits and client is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.wait(CLIENT_GRACE)
            self._exited_container(ref, client.returncode)
        elif ref.pid not in self.exits and ref in self._exit_files:
            self._exited_container(ref, _exit_written(self._exit_files[ref], EXIT_FILE_WAIT))
        container = self._containers.get(ref)
        if container is not None and ref not in self._asked:
            self._asked.add(ref)  # once: the daemon's exit watch and its next pass both ask
            self._ended_by_runtime(ref, container, self.exits.get(ref.pid))
        return self.exits.get(ref.pid)

    def _ended_by_runtime(
        self, ref: ProcessRef, container: ContainerRef, said: ExitStatus | None
    ) -> None:
        """What the runtime keeps of a container engine's end (its State, until the
        container is removed: kubelet's last state). Where its `run` said no code (killed,
        or its stream lost: docker's daemon killed under it, 125), the code, waited for
        while it still runs; where it said one that is not 0, whether the OOM killer ended
        it (`run` says 137 alone)."""
        from controller.host.containers import Runtime

        runtime = Runtime(container.runtime)
        if said is None:
            ended = runtime.exit_code(container.id, ref.start_time)
        elif said.code:
            ended = runtime.ended(container.id)
        else:
            return
        if ended is not None:
            code = ended.code if said is None else said.code
            self.exits[ref.pid] = ExitStatus(code, None, oom_killed=ended.oom_killed)

    def late_exit(self, rec: Record) -> ExitStatus | None:
        """A dead container engine's exit from its container's State, where its exit file
        is still there (its teardown could not remove the container: the runtime did not
        answer); the container then removed. A stat alone for every other record."""
        if rec.container is None or rec.nonce is None or rec.ref is None:
            return None
        if not self._exit_file(rec).exists() or self.alive(rec.ref):
            return None
        from controller.host.containers import Runtime

        ended = Runtime(rec.container.runtime).ended(rec.container.id)
        if ended is None:
            return None
        self._remove_container(rec, rec.container)
        return ExitStatus(ended.code, None, oom_killed=ended.oom_killed)

    def previous_exit(self, rec: Record) -> ExitStatus | None:
        """The run before ``rec``'s own, restarted while its runtime did not answer: its
        container's State, once it answers, then the container and its exit file removed
        (the file, kept till then, is what keeps ``drop_unused_env_files`` from removing
        the container unread). NOT_KEPT: the file or the container is gone."""
        before = rec.unread_exit
        if before is None:
            return None
        from controller.backends.local.container import exit_file
        from controller.host.containers import Runtime

        path = exit_file(self.state_dir, instance_of(rec.name), before.nonce)
        if not path.exists():
            return NOT_KEPT
        runtime = Runtime(before.container.runtime)
        ended = runtime.ended(before.container.id)
        if ended is None:
            return self._unread_gone(runtime, before.container.id, path)
        with contextlib.suppress(ContainerError):  # not removed: a later pass's, as unused
            runtime.remove(before.container.id, 0)
            path.unlink(missing_ok=True)
        return ExitStatus(ended.code, None, oom_killed=ended.oom_killed)

    def _unread_gone(self, runtime: Runtime, cid: str, path: Path) -> ExitStatus | None:
        """NOT_KEPT where the runtime answers that the container is gone (its exit file
        then removed); None where it does not answer, or the container runs on."""
        if not runtime.removed(cid):
            return None
        path.unlink(missing_ok=True)
        return NOT_KEPT

    def _exited_container(self, ref: ProcessRef, code: int | None) -> None:
        from controller.backends.local.container import RUNTIME_CODES

        # A negative code is the `run`'s shell killed by a signal (it exits with its `run`'s
        # code, never by one): no one said how the engine ended. 125-127: the runtime's own.
        if code is not None and code >= 0 and code not in RUNTIME_CODES:
            self.exits[ref.pid] = ExitStatus(code, None)

    def _reap_all(self) -> None:
        """Collect every child that ended, whatever killed it (a reaped orphan has no
        record whose liveness check would): no zombie outlives the next observation."""
        for pid in list(self._children):
            self._reap(pid)
        ended = [pid for pid, client in self._clients.items() if client.poll() is not None]
        for pid in ended[:-CLIENTS_KEPT]:  # the oldest: their exits were long read
            del self._clients[pid]

    def _reap(self, pid: int) -> None:
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            code = child.returncode
            self.exits[pid] = ExitStatus(None, -code) if code < 0 else ExitStatus(code, None)
            del self._children[pid]

    # -- spawn ---------------------------------------------------------------

    def marker(self, name: str, nonce: str) -> str:
        return f"{self.node}/{name}/{nonce}"

    def launch(self, launch: StartRequest) -> Instance:
        """Spawn on this node, exactly where the reservation says (devices, port)."""
        rec = launch.record
        assert rec.nonce is not None
        if launch.entry.deployment.spec.container is not None:
            return self._launch_container(launch)
        ref = self.spawn(
            launch.rendered.argv,
            engine_env(launch.rendered.env),
            name=instance_of(rec.name),  # the replica (`@next` is its future): orphans map back
            nonce=rec.nonce,
            log_path=launch.log_path,
        )
        return Instance(ref=ref, node=rec.node, host=rec.host, port=rec.port, devices=rec.devices)

    def _launch_container(self, launch: StartRequest) -> Instance:
        rec = launch.record
        assert rec.nonce is not None
        marker = self.marker(instance_of(rec.name), rec.nonce)
        from controller.backends.local.container import Passed, container_env

        passed = None if self.containers.static_devices else Passed.of(rec.devices)
        env = container_env(launch.rendered.env, passed)
        ref, kept, client, pulled = self.containers.launch(
            launch, marker, env, lambda: self._leader(rec.nonce)
        )
        self._clients[ref.pid] = client
        said = f"image {kept.image} pulled: {kept.digest}" if pulled else ""  # the pass's event
        return Instance(
            ref=ref, node=rec.node, host=rec.host, port=rec.port, devices=rec.devices,
            container=kept, message=said,
        )  # fmt: skip

    def command_line(self, launch: StartRequest) -> CommandLine | None:
        rendered, rec = launch.rendered, launch.record
        if launch.entry.deployment.spec.container is None:
            shown = tuple(redact_args(rendered.argv))
            return CommandLine(shown, tuple(sorted(rendered.env)), _unrunnable(launch))
        from controller.backends.local.container import Passed, container_env

        assert rec.nonce is not None
        passed = None if self.containers.static_devices else Passed.of(rec.devices)
        env = container_env(rendered.env, passed)
        marker = self.marker(instance_of(rec.name), rec.nonce)
        argv = self.containers.command_line(launch, marker, env)
        return CommandLine(tuple(redact_args(argv)), tuple(sorted(env)))

    def _leader(self, nonce: str | None) -> ProcessRef | None:
        """The marker process of ``nonce`` whose parent carries none (the engine)."""
        marked = [m for m in self.scan() if m.nonce == nonce]
        pids = {m.ref.pid for m in marked}
        roots = sorted((m for m in marked if m.ppid not in pids), key=lambda m: m.ref.start_time)
        return roots[0].ref if roots else None

    def refresh(self, records: Iterable[Record]) -> None:
        """Nothing to batch (each liveness check is one read of /proc); each container
        engine's exit file and container are named, for ``exit_of``."""
        engines = [rec for rec in records if rec.container and rec.ref]
        self._exit_files = {rec.ref: self._exit_file(rec) for rec in engines if rec.ref}
        self._containers = {
            rec.ref: rec.container
            for rec in engines
            if rec.ref and rec.container and rec.phase in (Phase.STARTING, Phase.READY)
        }
        self._asked &= self._containers.keys()

    def _exit_file(self, rec: Record) -> Path:
        from controller.backends.local.container import exit_file

        assert rec.nonce is not None  # a record with an engine has its nonce
        return exit_file(self.state_dir, instance_of(rec.name), rec.nonce)

    def instance_of(self, rec: Record) -> Instance | None:
        return None  # engines stay where the reservation put them

    def container_of(self, rec: Record) -> ContainerRef | None:
        """Asked of the runtime the spec names only for a spec.container engine, so adopting
        a process costs no runtime call; a runtime that cannot answer leaves it unknown."""
        spec = rec.stored_spec.get("container")
        if not isinstance(spec, dict) or rec.nonce is None:
            return None
        marker = self.marker(instance_of(rec.name), rec.nonce)
        try:
            return self.containers.found(spec.get("runtime"), marker)
        except ContainerError as exc:
            log.warning("container of an adopted engine unknown", deployment=rec.name,
                        reason=str(exc))  # fmt: skip
            return None

    def prepared(self, spec: DeploymentSpec, running: Record) -> Held | None:
        # One node: the new engine starts where the running one runs.
        return None if spec.container is None else self.containers.prepared(spec)

    def fetching(self, spec: DeploymentSpec, starting: int = 1, ahead: int = 0) -> ImageWait | None:
        # One node: the image is here or not for every instance alike.
        why = None if spec.container is None else self.containers.fetching(spec)
        return None if why is None else ImageWait(why)

    def image_nodes(self, spec: DeploymentSpec) -> frozenset[str]:
        return frozenset()  # one node: its devices name none

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        return None if spec.container is None else self.containers.fetch(spec)

    def drop_unused_pulls(self, specs: Iterable[DeploymentSpec]) -> int:
        # Every pass asks; only a node that pulled an image has a job to forget. One that
        # never did (most) loads no container code for it (~9 ms of each `--once`).
        if not any(StateDir(Path(self.state_dir)).images.glob("*.json")):
            return 0
        return self.containers.drop_unused_pulls(specs)

    def drop_unused_env_files(self, records: Callable[[], Iterable[Record]]) -> int:
        runs = StateDir(Path(self.state_dir)).runs
        left = (*runs.glob("reconcile-*.env"), *runs.glob("reconcile-*.rc"))
        if not left:  # no container code for a node without
            return 0
        return self.containers.drop_unused_env_files(records)

    def unplaceable(self, spec: DeploymentSpec) -> str | None:
        """The planner's ledger of this node's devices already decided; a port this user may
        never bind (`port: 80`, not as root) it cannot see. A container's runtime binds for
        itself (docker's daemon is root): only a process is refused."""
        port = spec.process_port
        return ports.privileged(port) if port is not None else None

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str,
        nonce: str,
        log_path: Path,
        preexec: Callable[[], None] | None = None,
    ) -> ProcessRef:
        """Exec ``argv`` in a new session once its spawn note is written (``execgate.py``:
        no engine runs that no note names); ``preexec`` runs in the child before exec."""
        full_env = dict(env)
        full_env[MARKER] = self.marker(name, nonce)
        full_env[STATE_MARKER] = self.state_dir
        for fact in (OWNER_MARKER, STATE_ID_MARKER):  # facts of ours, never the spec's word
            full_env.pop(fact, None)
        known = self.state_id()
        if known is not None:  # a state dir no pass made an id for (a Ray node's) has none
            full_env[STATE_ID_MARKER] = known
        if self.owner is not None:
            full_env[OWNER_MARKER] = self.owner
        noted = {k: full_env[k] for k in NOTED if k in full_env}
        cg = self._new_cgroup(name, nonce)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # argv only, never a shell (invariant 10); a new session = a new group.
            child = execgate.spawn(
                list(argv), full_env, gate_env=_gate_env(), log_fd=log_fd, preexec=preexec,
                before_exec=lambda pid: self._note(nonce, pid, noted, self._joined(cg, pid)),
            )  # fmt: skip
        except OSError as exc:
            self.notes.forget(nonce)  # its process never became the engine
            if cg is not None:
                cgroups.remove(cg)  # the gate has ended: nothing is left in it
            said = f"cannot exec {argv[0]!r}: {exc.strerror or exc}"
            if isinstance(exc, execgate.ExecRefused):  # the program's: --once exits 1 on it
                raise ExecFailed(said, execgate.NO_EXEC) from exc
            raise SpawnError(said) from exc
        finally:
            os.close(log_fd)
        self._children[child.pid] = child
        ref = identity(child.pid)
        if ref is None:  # exited before we could look: still report what ran
            return ProcessRef(pid=child.pid, start_time=time.time())
        return ref

    def _new_cgroup(self, name: str, nonce: str) -> Path | None:
        """The engine's own cgroup, made where this process may (None: it runs in none,
        as before: a state dir with no id yet, cgroup v1, not root, systemd's own tree)."""
        known, at = self.state_id(), cgroups.parent()
        if known is None or at is None:
            return None
        return cgroups.create(at, cgroups.name(known, name, nonce))

    def _joined(self, cg: Path | None, pid: int) -> Path | None:
        """``cg`` once the gate ``pid`` is in it (before its exec: every process the
        engine makes is born inside); None, the cgroup removed, where it cannot join."""
        if cg is None or cgroups.join(cg, pid):
            return cg
        cgroups.remove(cg)
        return None

    def _note(self, nonce: str, pid: int, env: Mapping[str, str], cg: Path | None) -> None:
        """The engine's spawn note, written before its exec: ``pid`` is the gate's, and an
        exec keeps both the pid and the start time. A note that cannot be written is said,
        not fatal: the engine runs, and its marker is what finds it wherever its environment
        can be read."""
        ref = identity(pid)
        if ref is None:
            return  # the gate is gone (killed): no engine will run
        try:
            failpoints.hit("runtime.spawn.before_note")
            self.notes.write(SpawnNote(nonce, ref, env, None if cg is None else str(cg)))
        except (OSError, ValueError) as exc:  # ValueError: a nonce no file may be named by
            log.warning("spawn note not written", pid=pid, reason=str(exc))

    # -- markers -------------------------------------------------------------

    def state_id(self) -> str | None:
        """This state dir's id, once a pass made it (``store/config/stateid.py``): read
        each time (a small file), as the folder at the path may be another by now."""
        return stateid.peek(Path(self.state_dir))

    def scan(self) -> list[MarkedProcess]:
        """Every live process of this node and state dir, found by its marker: one of
        another state dir at this path (``strangers``) is not this one's to judge."""
        here = self.state_id()
        return [m for m in self._marked() if not _another_dirs(m, here)]

    def strangers(self) -> list[MarkedProcess]:
        """Its engines, and its model pulls too: they write into this folder's cache and
        journal (``pull/launch.py``)."""
        here = self.state_id()
        found = [*self._marked(), *self._pulls()]
        return [m for m in found if _another_dirs(m, here)]

    def _pulls(self) -> list[MarkedProcess]:
        """The live pull processes of this state dir's path, as marked processes."""
        out = []
        for pull in launch.of_state_dir(Path(self.state_dir), self._pull_environs):
            st = procstat.stat(pull.pid)
            if st is not None:
                name = pull.deployments[0] if pull.deployments else pull.key
                ref, nonce = ref_of(pull.pid, st), f"pull-{pull.key}"
                out.append(MarkedProcess(ref, name, nonce, st.ppid, state_id=pull.state_id,
                                         pull=pull.key))  # fmt: skip
        return out

    def _marked(self) -> list[MarkedProcess]:
        self._reap_all()
        prefix = f"{MARKER}={self.node}/".encode()
        state = f"{STATE_MARKER}={self.state_dir}".encode()
        out = []
        for pid, env in self._environs(prefix):
            if state not in env.split(b"\0"):  # the whole variable: /a is not /a/b or /ab
                continue
            marked = _parse(pid, env, prefix)
            if marked is not None:
                out.append(marked)
        # By pid, not nonce: an engine's readable child carries the marker its leader hides.
        found = {m.ref.pid for m in out}
        return out + [m for n in self.notes.read_all() if n.ref.pid not in found
                      for m in self._noted(n, prefix, state)]  # fmt: skip

    def _noted(self, note: SpawnNote, prefix: bytes, state: bytes) -> list[MarkedProcess]:
        """``note``'s engine, if it runs (its pid and start time) and this user may not
        read its environment: found by the note, not its marker. A readable one the
        marker scan judged (one that carries no marker is not an engine of this state
        dir any more); none for one gone (a teardown removes its note: a scan only reads)."""
        if not process_alive(note.ref):
            return []
        try:
            procscan.environ_of(note.ref.pid)
            return []
        except PermissionError:
            pass
        env = note.environ()
        marked = _parse(note.ref.pid, env, prefix) if state in env.split(b"\0") else None
        return [] if marked is None else [dataclasses.replace(marked, noted=env)]

    # -- teardown ------------------------------------------------------------

    def stop(self, ref: ProcessRef | None, nonce: str | None, sig: int, grace: float) -> None:
        """Stop an instance completely; returns once nothing of it is left. NotProvenOurs,
        nothing signalled, for a live leader whose marker this user may not read."""
        deadline = time.monotonic() + grace
        cg = self._cgroup_of(nonce)
        if ref is not None and self.alive(ref):
            self._learn_cgroup(ref.pid)
            self._signal_all(ref, sig, nonce)
            # A stopped (SIGSTOP'd, hung in a debugger) engine cannot act on its stop
            # signal until it runs again: continue it, as systemd does after the kill
            # signal, so it gets its grace period to exit instead of waiting it out.
            self._signal_all(ref, signal.SIGCONT, nonce)
            failpoints.hit("runtime.stop.after_signal")
            self._wait_ended(ref, nonce, cg, deadline)
            if self.alive(ref):
                self._signal_group(ref, signal.SIGKILL, nonce=nonce)
        elif self._signal_remains(ref, nonce, sig):
            self._wait_ended(ref, nonce, cg, deadline)
        self.sweep(nonce, ref)

    def _wait_ended(
        self, ref: ProcessRef | None, nonce: str | None, cg: Path | None, deadline: float
    ) -> None:
        """Until nothing of the instance runs (its leader, its marker processes, its
        cgroup's members: a child that left the group and dropped the marker gets the
        grace too, whenever the leader ends) or ``deadline``."""
        while time.monotonic() < deadline and (
            (ref is not None and self._instance_alive(ref, nonce))
            or (cg is not None and cgroups.members(cg))
        ):
            time.sleep(POLL)

    def _signal_remains(self, ref: ProcessRef | None, nonce: str | None, sig: int) -> bool:
        """``sig`` (and SIGCONT) to what is left of an engine whose leader is dead: its
        group's members and its cgroup's, as systemd's stop signals the whole control
        group before its timeout's SIGKILL. False: nothing was left to signal."""
        cg = self._cgroup_of(nonce)
        left = bool(cg is not None and cgroups.members(cg))
        if nonce is not None:
            left = left or any(m.nonce == nonce and m.noted is None for m in self.scan())
        if not left:
            return False
        for each in (sig, signal.SIGCONT):
            group = None
            if ref is not None:
                group = self._signal_group(ref, each, nonce=nonce, leader_alive=False)
            if cg is not None:
                cgroups.signal_all(cg, each, but_group=group)
        return True

    def signal_stop(self, rec: Record) -> bool:
        """``stop``'s signals without its wait: the daemon's passes go on through the grace
        period, and a later one finishes the teardown (``teardown``). A container stops by
        the runtime's kill with the stop signal (its `stop` without the wait). An engine
        whose leader is gone: what is left of it (its group, its cgroup) gets the signal
        and its grace; nothing left, False (``teardown``'s sweep at once)."""
        if not self.alive(rec.ref):  # what is left of it gets its stop signal and grace
            return rec.container is None and self._signal_remains(
                rec.ref, rec.nonce, rec.stop_signal
            )
        assert rec.ref is not None  # alive
        if rec.container is not None:
            return self._signal_container(rec.container, rec.stop_signal)
        self._signal_all(rec.ref, rec.stop_signal, rec.nonce)
        self._signal_all(rec.ref, signal.SIGCONT, rec.nonce)  # as ``stop`` does
        return True

    def _signal_all(self, ref: ProcessRef, sig: int, nonce: str | None) -> None:
        """``sig`` to the engine's group (NotProvenOurs first, as ever), then to every
        member of its cgroup: a child that left the group gets its grace period too."""
        group = self._signal_group(ref, sig, nonce=nonce)
        cg = self._cgroup_of(nonce)
        if cg is not None:  # the kernel lists only processes inside our cgroup: ours
            cgroups.signal_all(cg, sig, but_group=group)  # each process once

    def _cgroup_of(self, nonce: str | None) -> Path | None:
        """The cgroup ``nonce``'s spawn note names, if it is one of ours for that run."""
        if nonce is None:
            return None
        note = next((n for n in self.notes.read_all() if n.nonce == nonce), None)
        if note is None:
            return self._cgroup_named(nonce)
        return cgroups.ours(note.cgroup, self.state_id(), nonce)

    def _cgroup_named(self, nonce: str) -> Path | None:
        """The cgroup of run ``nonce`` no note names (its spawn note could not be written):
        found by its name, this state dir's id and that run's, where this process makes
        them (``cgroups.named``)."""
        here, at = self.state_id(), cgroups.parent()
        return None if here is None or at is None else cgroups.named(at, here, nonce)

    def _signal_container(self, container: ContainerRef, sig: int) -> bool:
        """A container engine's stop signal, sent by its runtime (the container's PID 1
        is in a namespace of its own: the runtime knows it). False, nothing sent: it no
        longer runs, or the runtime does not answer; ``teardown`` then stops it as
        before, saying why it cannot."""
        from controller.host.containers import Runtime

        try:
            return Runtime(container.runtime).signal(container.id, sig)
        except ContainerError as exc:
            log.warning("container stop signal not sent", container=container.id[:12],
                        reason=str(exc))  # fmt: skip
            return False

    def stopped(self, rec: Record) -> bool:
        if rec.ref is None:
            return True
        return not self._instance_alive(rec.ref, rec.nonce) and not self.remains(rec)

    def remains(self, rec: Record) -> bool:
        """A member of the cgroup of ``rec``'s engine runs though its leader is gone (a
        child that left its group and dropped its marker): its port is still the dead
        engine's, never another process's, until its teardown empties the cgroup."""
        if rec.container is not None or rec.ref is None or self.alive(rec.ref):
            return False
        cg = self._cgroup_of(rec.nonce)
        return cg is not None and bool(cgroups.members(cg))

    def sweep(self, nonce: str | None, ref: ProcessRef | None = None) -> int:
        """SIGKILL the group and every marker process of ``nonce``; wait until gone."""
        if ref is not None:
            self._signal_group(ref, signal.SIGKILL, nonce=nonce, leader_alive=False)
        deadline = time.monotonic() + SWEEP_TIMEOUT
        killed: list[ProcessRef] = [ref] if ref is not None else []
        if nonce is None:
            self._wait_exited(killed, deadline)
            self._drop_dead_notes()
            return 0
        while time.monotonic() < deadline:
            # One found by its spawn note alone is not proven ours: never signalled here.
            left = [m for m in self.scan() if m.nonce == nonce and m.noted is None]
            if not left:
                break
            for m in left:
                if self.alive(m.ref):
                    self._learn_cgroup(m.ref.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(m.ref.pid, signal.SIGKILL)
                        killed.append(m.ref)
            time.sleep(POLL)
        self._wait_exited(killed, deadline)
        if nonce not in self._learned and not any(n.nonce == nonce for n in self.notes.read_all()):
            found = self._cgroup_named(nonce)  # no note names it: empties it by its name
            if found is not None:
                self._learned[nonce] = found
        self._empty_learned(nonce)
        self._drop_dead_notes()
        return len(killed) - (ref is not None)

    def _learn_cgroup(self, pid: int) -> None:
        """Before a kill: the engine cgroup ``pid`` is in, where its marker names the state
        dir and the run the cgroup's name says. A teardown whose note is gone (the engine
        of another state dir at this path, reaped; a state dir restored from a backup)
        still reaches what the engine left in it."""
        environ = procscan.environ(pid)
        prefix = f"{MARKER}={self.node}/".encode()
        marked = None if environ is None else _parse(pid, environ, prefix)
        found = None if marked is None else cgroups.of_pid(pid)
        if marked is not None and found is not None:
            cg = cgroups.ours(str(found), marked.state_id, marked.nonce)
            if cg is not None:
                self._learned[marked.nonce] = cg

    def _empty_learned(self, nonce: str) -> None:
        cg = self._learned.pop(nonce, None)
        if cg is None:
            return
        if cgroups.kill(cg, time.monotonic() + SWEEP_TIMEOUT):
            cgroups.remove(cg)
        else:
            log.warning("engine cgroup not emptied", cgroup=str(cg), left=cgroups.members(cg))

    def _drop_dead_notes(self) -> None:
        """Remove the spawn notes whose process is gone (its own, and any an earlier crash
        left): that identity never runs again. A teardown's work, as a writer's: the read
        verbs' scans change nothing. The engine's cgroup goes first, with every process
        still in it (one that left the group and dropped the marker): a note whose cgroup
        would not empty stays, so the next teardown tries again."""
        here = self.state_id()
        notes = self.notes.read_all()
        for note in notes:
            if not process_alive(note.ref) and self._cgroup_emptied(note, here):
                self.notes.forget(note.nonce)
        self._drop_empty_cgroups(here, {n.nonce for n in notes})

    def _cgroup_emptied(self, note: SpawnNote, here: str | None) -> bool:
        cg = cgroups.ours(note.cgroup, here, note.nonce)
        if cg is None:
            return True  # none, or gone: nothing of the engine is left there
        if not cgroups.kill(cg, time.monotonic() + SWEEP_TIMEOUT):
            log.warning("engine cgroup not emptied", cgroup=str(cg), left=cgroups.members(cg))
            return False
        cgroups.remove(cg)
        return True

    def _drop_empty_cgroups(self, here: str | None, noted: set[str]) -> None:
        """Remove this state dir's empty engine cgroups no note names, made where this
        process makes them: a spawn whose pass was killed before it noted its engine."""
        at = cgroups.parent()
        if here is None or at is None:
            return
        for cg in cgroups.leftovers(at, here, noted, CGROUP_SETTLE):
            cgroups.remove(cg)

    def _wait_exited(self, refs: Iterable[ProcessRef], deadline: float) -> None:
        """Until each of ``refs`` has exited (gone, or a zombie). A scan no longer sees a
        dying process's marker once its memory is released, but its files (a listening
        socket) close only after that: a port check right after a reap saw the port
        still held ("port in use") while the engine was nearly gone."""
        left = list(refs)
        while left and time.monotonic() < deadline:
            left = [r for r in left if self.alive(r)]
            if left:
                time.sleep(POLL)

    def prove_ours(self, rec: Record) -> None:
        """``stop``'s first question, asked alone: a live leader it may not signal."""
        if rec.container is not None:
            return  # ``teardown`` has the runtime stop it by its id first: no signal of ours
        if rec.ref is not None and self.alive(rec.ref):
            self._may_signal(rec.ref, rec.nonce)

    def kill(self, ref: ProcessRef) -> None:
        """SIGKILL a process a scan found by its marker (a reap: its sweep follows)."""
        if self.alive(ref):
            self._learn_cgroup(ref.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(ref.pid, signal.SIGKILL)
            child = self._children.get(ref.pid)
            if child is not None:  # ours: collect it now, or it stays a zombie
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(SWEEP_TIMEOUT)
                self._reap(ref.pid)
            self._wait_exited([ref], time.monotonic() + SWEEP_TIMEOUT)  # its sockets closed

    def teardown(self, rec: Record) -> None:
        """Stop every process of the instance; on NVML hosts, wait for its GPU memory."""
        uuids = tuple(u for u in rec.device_uuids if u)
        pids = {m.ref.pid for m in self.scan() if m.nonce == rec.nonce} if uuids else set()
        if rec.ref is not None:
            pids.add(rec.ref.pid)
        cg = self._cgroup_of(rec.nonce) if uuids else None
        pids.update(cgroups.members(cg) if cg is not None else ())
        if rec.container is not None:  # the runtime's stop (grace, then kill), then rm
            self._remove_container(rec, rec.container)
        self.stop(rec.ref, rec.nonce, rec.stop_signal, rec.grace_seconds)
        if uuids and not wait_gpu_release(uuids, pids):
            log.warning("gpu memory still held", deployment=rec.name, devices=list(rec.devices))

    def _remove_container(self, rec: Record, container: ContainerRef) -> None:
        """The runtime's stop and rm: no container is run with `--rm`, so an ended one
        keeps its exit code for the pass to read (``exit_of``) until this. An engine
        already dead (its container's main process gone) is not running whatever the
        runtime says: one that does not answer (docker's daemon down) is no reason to stop
        the pass, which every other deployment of the node waits on; its exit file is then
        kept, and a pass removes the container once no record names it and the runtime
        answers (``Wrapper.drop_unused_env_files``)."""
        from controller.host.containers import Runtime

        running = rec.ref is not None and self.alive(rec.ref)
        removed = True
        try:
            Runtime(container.runtime).remove(container.id, rec.grace_seconds)
        except ContainerError as exc:
            if rec.ref is not None and self.alive(rec.ref):
                raise  # a running engine: stopping it needs the runtime
            removed = False
            log.warning("container of a dead engine not removed: a later pass removes it",
                        deployment=rec.name, container=container.id[:12],
                        reason=str(exc))  # fmt: skip
        if rec.nonce is not None:  # its `run` says how it ended, as it ends: read by no one
            exit_file = self._exit_file(rec)
            if running:  # it ends just after its container's removal
                _exit_written(exit_file, EXIT_FILE_WAIT)
            if removed:
                exit_file.unlink(missing_ok=True)

    def listening_ports(self) -> frozenset[int]:
        return ports.listening_ports()

    def port_bindable(self, port: int) -> bool:
        return ports.port_bindable(port)

    # A replica's log is `logs/<instance>.log`; a `@next` writes into its instance's.
    def log_since(self, rec: Record, offset: int) -> tuple[bytes, int] | None:
        return logfiles.read_from(self.store.log_path(rec.name), offset)

    def log_tail(self, name: str, count: int) -> list[str]:
        return logfiles.current_run_tail(self.store.log_path(name), count)

    def runtime_log(self, rec: Record) -> list[str] | None:
        if rec.container is None or rec.nonce is None or not self.alive(rec.ref):
            return None
        from controller.backends.local.container import exit_file, run_ended

        if not run_ended(exit_file(self.state_dir, instance_of(rec.name), rec.nonce)):
            return None
        return [rec.container.runtime, "logs", rec.container.id]

    def _instance_alive(self, ref: ProcessRef, nonce: str | None) -> bool:
        if self.alive(ref):
            return True
        return nonce is not None and any(m.nonce == nonce for m in self.scan())

    def _may_signal(self, ref: ProcessRef, nonce: str | None) -> bool:
        """Never init, never our own group, never a live process without this instance's marker.

        A record can name a live foreign process exactly (edited by hand, or forged): the
        marker, which only our spawn sets, is what makes a process ours to signal.
        """
        if ref.pid <= 1 or ref.pid == os.getpgrp():
            return False
        # A zombie leader has ended too (its pid is not reused until reaped): to a user
        # who is not root its environment reads EACCES, which is not "not ours".
        current = live_identity(ref.pid)
        if nonce is None or current is None:
            return True  # the leader is gone: what is left of its group is ours
        try:
            return self._carries(ref.pid, nonce)
        except PermissionError:
            # Not dumpable (a file-capability or setuid program): its marker unreadable to
            # this user. False would read as "not ours, so gone" and drop a running
            # engine's record (invariant 3); a signal would be to a process not proven ours.
            if not ref.same_process(current):
                return False  # another process holds the pid now: the engine is gone
            if self._spawned(ref.pid):
                return True  # our own unreaped child: its pid is no one else's
            if procstat.exiting(ref.pid):
                # Its memory going, its environment reads EACCES to all but root (root's
                # read finds no marker there): ending, it needs no signal, nor a refusal.
                return False
            raise NotProvenOurs(_unreadable(ref.pid)) from None

    def _spawned(self, pid: int) -> bool:
        """A child this process spawned and has not reaped (so its pid is still its)."""
        child = self._children.get(pid)
        return child is not None and child.returncode is None

    def _carries(self, pid: int, nonce: str) -> bool:
        """Whether ``pid``'s environment holds this instance's marker; PermissionError
        when this user may not read it."""
        # Right after spawn the environment can read empty for a moment: Popen returns
        # once exec has begun, before the kernel lays out the new environment.
        deadline = time.monotonic() + ENVIRON_WAIT
        while True:
            found = procscan.environ_of(pid)
            if found is None:
                return False
            data = found
            if data or time.monotonic() >= deadline:
                break
            time.sleep(POLL)
        return self._holds_marker(data, nonce)

    def _holds_marker(self, environ: bytes, nonce: str) -> bool:
        """Whether an environment holds this node's marker of instance ``nonce``."""
        marker = f"{MARKER}={self.node}/".encode()
        items = environ.split(b"\0")
        return any(i.startswith(marker) and i.endswith(f"/{nonce}".encode()) for i in items)

    def _group_carries(self, pgid: int, nonce: str) -> bool:
        """Whether a member of the group ``pgid``, whose leader is gone, carries the marker.

        On one boot, a dead leader's group id is no other group's while a member lives,
        so what is left of it was the engine's. After a reboot, or a pid namespace's
        restart (the daemon's container restarted) with the state dir kept, the recorded
        pid can be a foreign group's id, its leader gone too: only a member carrying this
        instance's marker (an engine's children inherit it) proves the group ours. One
        whose environment this user may not read proves nothing (as ``_may_signal``).
        """
        for pid in procstat.group(pgid):
            environ = procscan.environ(pid)  # None: gone, or not ours to read
            if environ is not None and self._holds_marker(environ, nonce):
                return True
        return False

    def _signal_group(
        self, ref: ProcessRef, sig: int, *, nonce: str | None, leader_alive: bool = True
    ) -> int | None:
        """``sig`` to the engine's process group; the group it reached (None: none, or
        its leader alone), whose processes a cgroup's signal then skips."""
        if not self._may_signal(ref, nonce):
            return None
        if leader_alive and not self.alive(ref):
            return None  # never signal a process whose identity does not match (invariant 6)
        if not leader_alive and _reused(ref):
            return None  # the pid (so the group id) is another process's now (invariant 6)
        if not leader_alive and nonce is not None and not self._group_carries(ref.pid, nonce):
            return None  # no member is proven ours: the group id may be another's (a reboot)
        try:
            # Engines are session (and group) leaders: pgid == pid. An adopted engine
            # that moved groups is signalled alone; the marker sweep finds the rest.
            if leader_alive and os.getpgid(ref.pid) != ref.pid:
                os.kill(ref.pid, sig)
                return None
            os.killpg(ref.pid, sig)
        except ProcessLookupError:
            return None
        except PermissionError as exc:
            if exc.errno != errno.EPERM:
                raise
            return None
        return ref.pid


def _unrunnable(launch: StartRequest) -> str | None:
    """Why ``launch``'s exec would fail, found where its start will look (the PATH of
    ``engine_env``, as the gate's exec is given it), with the launcher's next move."""
    rendered = launch.rendered
    program = rendered.argv[0] if rendered.argv else ""
    why = execgate.unrunnable(program, engine_env(rendered.env)) if program else None
    if why is None:
        return None
    hint = no_program(launch.entry, engine_path(program, rendered.env))
    return f"a start would fail: cannot exec {program!r}: {why}{hint}"


def _gate_env() -> dict[str, str]:
    """The environment an engine's gate runs with until its exec: this process's, with no
    marker (a scan never takes a waiting gate for an engine)."""
    return {k: v for k, v in os.environ.items() if k not in MARKERS}


def _exit_written(path: Path, wait: float) -> int | None:
    """The status a container's `run` wrote to ``path``, waited for up to ``wait`` s: it
    ends just after its engine. None: none is coming (no file: an older version's `run`;
    its shell gone: killed with it) or none came."""
    from controller.backends.local.container import exit_status, status_coming

    deadline = time.monotonic() + wait
    while (code := exit_status(path)) is None and time.monotonic() < deadline:
        if not status_coming(path):
            return exit_status(path)  # written just before its shell ended, or none
        time.sleep(POLL)
    return code


def _unreadable(pid: int) -> str:
    """Why pid was not signalled, and the next move (the record keeps it; `down` says it)."""
    return (
        f"pid {pid} runs (its start time is the record's) but its environment "
        f"(/proc/{pid}/environ), whose marker proves it this node's engine, is not readable "
        f"to this user (uid {os.geteuid()}): a file-capability or setuid program is not "
        "dumpable. Nothing was signalled and the record is kept. Run reconcile as the user that "
        f"started it, or as root; or end pid {pid} by hand: the next pass finds it gone "
        "and goes on"
    )


def _reused(ref: ProcessRef) -> bool:
    """A live process holds ``ref.pid`` but is not ``ref``.

    While any member of a group lives, the kernel does not reuse its leader's pid, so
    a free pid means the group (if any) is what is left of ours.
    """
    current = identity(ref.pid)
    return current is not None and not ref.same_process(current)


def _parse(pid: int, env: bytes, prefix: bytes) -> MarkedProcess | None:
    items = env.split(b"\0")
    for item in items:
        if item.startswith(prefix):
            rest = item[len(prefix) :].decode(errors="replace")
            name, _, nonce = rest.partition("/")
            st = procstat.stat(pid)
            if st is None or not nonce:
                return None
            ref, ppid = ref_of(pid, st), st.ppid
            state_id = value_of(items, STATE_ID_MARKER)
            return MarkedProcess(ref, name, nonce, ppid, owner_of(items), state_id=state_id)
    return None


def _another_dirs(marked: MarkedProcess, here: str | None) -> bool:
    """Started by a state dir of another id than ``here`` (None: this one has made none
    yet, so none of its engines carries one); one without an id, an older version's, is
    judged as before."""
    return marked.state_id is not None and marked.state_id != here


def owner_of(items: Sequence[bytes]) -> str | None:
    """The owner an engine's environment names (None: an older version's engine)."""
    return value_of(items, OWNER_MARKER)


def value_of(items: Sequence[bytes], variable: str) -> str | None:
    """``variable``'s value in an environment's items (None: it has none)."""
    prefix = f"{variable}=".encode()
    found = next((i for i in items if i.startswith(prefix)), None)
    return None if found is None else found[len(prefix) :].decode(errors="replace")
