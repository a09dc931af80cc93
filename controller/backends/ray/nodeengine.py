"""The engine's life on its node, for its actor (``actor.EngineHost``), which imports this
module when it starts there: the driver never does.

It runs the engine the way the local backend does (a new session, argv only, the
``RECONCILE_INSTANCE`` marker, the log file), with what only the node knows: the GPUs
Ray assigned (``CUDA_VISIBLE_DEVICES`` from ``ray.get_gpu_ids()``) and a port that a
bind probe found free there. A crashed engine is restarted with our back-off.

An engine never outlives its actor: it is spawned with ``PR_SET_PDEATHSIG`` (SIGKILL
when the thread that forked it ends, and that thread lives as long as the actor), and
an actor that starts (again) first kills any engine of its deployment still carrying
our marker on this node, left by an earlier incarnation.

A ``spec.container`` engine is run by the same wrapper the local backend uses (where it
runs and how it is wrapped stay separate choices): host networking on the port found
here, the marker in its environment, the labels, the log. Its main process is not our
child (the runtime's), so it cannot die with the actor: the driver asks the actor to stop
it before killing the actor, and a new actor's sweep kills a leftover's main process.
No container is run with ``--rm`` (its exit code stays readable until it is removed):
the actor removes an ended engine's container itself before it restarts it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

import ray

from controller.backends.base import StartRequest, engine_env
from controller.backends.local.container import container_name, exit_file, runtime_in
from controller.backends.local.runtime import MARKER, STATE_MARKER, LocalBackend
from controller.backends.ray.hostwords import MISSING_MODEL, PULLING_IMAGE, node_root
from controller.core.devices.inventory import Device
from controller.core.imagepulls import FAILED
from controller.core.manifest.specs import Entry
from controller.core.plan import BACKOFF_RESET, backoff, restarts_after
from controller.core.render import Rendered, render
from controller.core.state import ContainerRef, ProcessRef, Record
from controller.errors import ContainerError, SpawnError
from controller.host.containers import Runtime
from controller.host.ports import listening_ports, port_bindable
from controller.host.procscan import EnvironScan
from controller.logsetup import get_logger
from controller.redact import redact_args
from controller.store.instances import logfiles

PORT_SCAN = 1000  # ports tried upward from the planner's
FIRST_SPAWN_WAIT = 15.0  # seconds __init__ waits for the first engine (status then has it)
POLL = 0.1
LOOPBACK = ("127.0.0.1", "localhost", "::1")
PR_SET_PDEATHSIG = 1
log = get_logger("reconcile")


class Job(Protocol):
    """What the engine reads of its actor's job (``actor.EngineJob``: this module imports
    nothing of ``actor``, which imports it)."""

    @property
    def entry(self) -> Entry: ...
    @property
    def nonce(self) -> str: ...
    @property
    def state_key(self) -> str: ...
    @property
    def base_port(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def model_path(self) -> str | None: ...


class NodeEngine:
    """One engine's life on this node, for its actor (``actor.EngineHost``)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.node_id = ray.get_runtime_context().get_node_id()
        self.address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.gpus = tuple(str(int(g)) for g in ray.get_gpu_ids())
        self.root = node_root(job.state_key)
        self.log_path = self.root / f"{job.name}.log"
        # marker: <node id>/<record>/<nonce>. Ray's GPUs are a count: only a node that has
        # the device files has devices to pass into a container.
        self.local = LocalBackend(self.root, self.node_id, static_devices=not _gpu_files())
        sweep_leftovers(str(self.root.resolve()), job.name)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.ref: ProcessRef | None = None
        self.container: ContainerRef | None = None
        self.port: int | None = None
        self.message = "starting the engine"
        self.ended: tuple[int | None, int | None] | None = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._supervise, name="engine", daemon=True)
        self.thread.start()
        self.first.wait(FIRST_SPAWN_WAIT)

    # -- what the actor answers the driver (its status: the fields above) ------------

    def log_tail(self, count: int) -> list[str]:
        return logfiles.current_run_tail(self.log_path, count)

    def log_since(self, offset: int) -> tuple[bytes, int]:
        """The log from ``offset`` on (all of it from 0), and the offset to ask next."""
        return logfiles.read_from(self.log_path, offset) or (b"", 0)

    def stop(self, sig: int, grace: float) -> None:
        """Stop supervising, then the engine: the stop signal, grace, SIGKILL, sweep."""
        self.stopping.set()
        with self.lock:
            ref, container = self.ref, self.container
        if container is not None:  # the runtime's stop (grace, then kill), then rm
            try:
                Runtime(container.runtime).remove(container.id, grace)
            except ContainerError as exc:  # the sweep below still kills its processes
                with self.lock:
                    self.message = str(exc)
        self.local.stop(ref, self.job.nonce, sig, grace)
        self.thread.join(grace + 5)

    # -- the engine's life on this node -----------------------------------------------

    def _supervise(self) -> None:
        crashes = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            ref = self._spawn()
            if ref is None and self.message.startswith((MISSING_MODEL, PULLING_IMAGE, FAILED)):
                self.first.set()  # the status says so (a restart would overwrite it)
                # No restart brings them: the driver forgets the node and pulls the model
                # again, or waits for the image's pull on this node (Pulling) and comes back,
                # or backs off for a pull that ended without it (holding nothing).
                return
            self.first.set()
            if ref is None:
                code: int | None = None
                sig: int | None = None
            else:
                code, sig = self._wait(ref)
                if self.stopping.is_set():
                    return
                self._remove_ended()
                if not restarts_after(self.job.entry.deployment.spec.restart_policy, code):
                    with self.lock:
                        self.ref, self.container, self.ended = None, None, (code, sig)
                        self.message = f"engine {_exit_text(code, sig)}; not restarted (policy)"
                    return
            if time.monotonic() - started >= BACKOFF_RESET:
                crashes = 0  # ran fine for 10 minutes: this crash counts as the first
            delay = backoff(crashes)
            crashes += 1
            with self.lock:
                self.ref, self.container = None, None
                # Why it could not start (a runtime's words) stays in what the driver reads.
                why = f" ({self.message})" if self.message else ""
                what = f"could not start{why}" if ref is None else _exit_text(code, sig)
                self.message = f"engine {what}; the actor restarts it in {delay:g}s"
            if self.stopping.wait(delay):
                return

    def _remove_ended(self) -> None:
        """The ended engine's container, removed (its code is read): none is left behind
        by a restart or an engine not restarted (a runtime that does not answer: said)."""
        with self.lock:
            container = self.container
        if container is None:
            return
        try:
            Runtime(container.runtime).remove(container.id, 0)
        except ContainerError as exc:
            log.warning("ended engine's container not removed", container=container.id[:12],
                        reason=str(exc))  # fmt: skip

    def _spawn(self) -> ProcessRef | None:
        entry = _bind_all(self.job.entry)
        port = self._free_port(self.job.base_port)
        devices = tuple(Device(kind="nvidia", id=g) for g in self.gpus)
        missing = self._missing_model()
        if missing is not None:
            with self.lock:
                self.message = missing
            return None
        rendered = render(
            entry,
            devices=devices,
            port=port,
            runtime_dir=str(self.root),
            model_path=self.job.model_path,
        )
        argv = " ".join(redact_args(rendered.argv))  # as the local executor writes it
        logfiles.write_marker(
            self.log_path, f"start {self.job.name} instance {self.job.nonce}: {argv}"
        )
        container = None
        try:
            if entry.deployment.spec.container is not None:
                ref, container = self._run_container(entry, rendered, port)
            else:
                ref = self.local.spawn(
                    rendered.argv,
                    engine_env(rendered.env),
                    name=self.job.name,
                    nonce=self.job.nonce,
                    log_path=self.log_path,
                    preexec=die_with_parent(os.getpid()),
                )
        except SpawnError as exc:  # a runtime's refusal or a pull too: its words
            with self.lock:
                self.message = str(exc)
            return None
        with self.lock:
            self.ref, self.container, self.port, self.message = ref, container, port, ""
        return ref

    def _run_container(
        self, entry: Entry, rendered: Rendered, port: int
    ) -> tuple[ProcessRef, ContainerRef | None]:
        """The engine in its container on this node, as the local backend runs one."""
        record = Record(
            name=self.job.name,
            owner=self.job.state_key,
            node=self.node_id,
            nonce=self.job.nonce,
            port=port,
            devices=self.gpus,
        )
        request = StartRequest(
            entry=entry, record=record, rendered=rendered, log_path=self.log_path
        )
        instance = self.local.launch(request)
        assert instance.ref is not None  # a launch returns a running engine or raises
        return instance.ref, instance.container

    def _missing_model(self) -> str | None:
        """Why the pulled model cannot be read on this node, if it cannot."""
        path = self.job.model_path
        if path is None or os.path.exists(path):
            return None
        return (
            f"{MISSING_MODEL} {path} are no longer on Ray node {self.node_id[:8]} "
            f"({self.address}) (removed from its cache?): the next pass pulls them again"
        )

    def _wait(self, ref: ProcessRef) -> tuple[int | None, int | None]:
        while not self.stopping.is_set():
            status = self.local.exit_of(ref)
            if status is not None:
                return status.code, status.signal
            if not self.local.alive(ref):
                return None, None
            time.sleep(POLL)
        return None, None

    def _free_port(self, first: int) -> int:
        """A bind probe on this node, upward from the planner's port."""
        taken = listening_ports()
        for port in range(first, min(first + PORT_SCAN, 65536)):
            if port not in taken and port_bindable(port):
                return port
        raise SpawnError(f"no free port in {first}-{first + PORT_SCAN - 1} on this node")


def _gpu_files() -> bool:
    """This node has GPU device files (nvidia's or amd's) to pass into a container."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def _bind_all(entry: Entry) -> Entry:
    """A loopback ``spec.host`` would make the engine unreachable from other nodes."""
    spec = entry.deployment.spec
    if spec.host not in LOOPBACK:
        return entry
    deployment = entry.deployment.model_copy(
        update={"spec": spec.model_copy(update={"host": "0.0.0.0"})}
    )
    return dataclasses.replace(entry, deployment=deployment)


def _exit_text(code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"killed by signal {sig}"
    return f"exited with code {code}" if code is not None else "exited"


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A preexec for the engine: SIGKILL it when the thread that forked it ends (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os._exit(1)

    return preexec


def sweep_leftovers(state: str, name: str) -> int:
    """SIGKILL every engine of ``name`` in our namespace on this node (an earlier actor's)."""
    needle = f"{STATE_MARKER}={state}".encode()
    killed = 0
    for pid, env in EnvironScan()(f"{MARKER}=".encode()):
        items = env.split(b"\0")
        if needle not in items:
            continue
        marker = next((i for i in items if i.startswith(f"{MARKER}=".encode())), b"")
        parts = marker.decode(errors="replace").partition("=")[2].split("/")
        if len(parts) == 3 and parts[1] == name:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
            _remove_leftover(state, name, parts[2])
    return killed


def _remove_leftover(state: str, name: str, nonce: str) -> None:
    """The container of an earlier actor's engine (``nonce``), once its main process is
    killed: no `--rm` removes it. Only one its `run`'s exit file in this node's folder
    names (a container engine of ours); its runtime is the one the file names."""
    rc_file = exit_file(state, name, nonce)
    runtime = runtime_in(rc_file)
    if runtime is None:
        return
    try:
        Runtime(runtime).remove(container_name(name, nonce), 0)
    except ContainerError as exc:
        log.warning("leftover engine's container not removed", instance=name, reason=str(exc))
        return
    rc_file.unlink(missing_ok=True)
