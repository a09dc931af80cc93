"""How an engine is wrapped: in a container, on the node the backend chose.

Not a backend of its own: where an engine runs (this node, a Ray node) and how it is
wrapped (a process, a container) are separate choices, and the planner knows neither.
The local backend (and the Ray actor, through it) hands a ``spec.container`` launch here.

The contract is a process's: the host's network and the leased port, the rendered
environment plus the marker (``RECONCILE_INSTANCE``, ``RECONCILE_STATE``,
``RECONCILE_STATE_ID``, ``RECONCILE_OWNER``: the label ``reconcile.owner`` too), the recipe's
argv in place of the image's entrypoint, the model cache read-only at the same path, the
engine's output in the deployment's log file. The record's ``ref`` is the container's
main process as this host sees it, so liveness (invariant 6), the marker scan and the
sweep work on it as on any engine. No ``--rm``: a container whose main process ended
stays, its State (exit code, OOM kill) kept by the runtime, until a pass has read it and
removes it (the teardown; a pass, once no record names it: no container outlives its
engine for long), as kubelet reads a container's last state from its runtime.

The runtime's ``run`` is started attached, in a session of its own, with its output into
the log file: it streams the engine's output there for as long as the container runs and
ends with it. It carries no marker (it is not the engine). Its exit status is its
container's (the engine's own code); a shell that waits for it writes that status to
``run/<container>.rc`` (:func:`exit_file`), where a pass that is not its parent (an
adopter: the next ``--once``, a restarted daemon) reads it, and the runtime's name after
it: the file stays until the container is removed, and a pass that finds it with no
record naming it removes that container (a crash of ours between).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller import failpoints
from controller.backends.base import Held, StartRequest
from controller.core import imagepulls
from controller.core.digest import sha256_hex
from controller.core.manifest.names import instance_of
from controller.core.manifest.specs import Container, DeploymentSpec
from controller.core.render import container_image
from controller.core.state import ContainerRef, ProcessRef, Record
from controller.errors import (
    ContainerError,
    ContainerExited,
    ImagePullFailed,
    PullingFirst,
    Unplaceable,
)
from controller.host import containers, procstat
from controller.host.containers import Runtime
from controller.host.procs import identity, process_alive
from controller.logsetup import get_logger
from controller.store.config import stateid
from controller.store.documents import Document
from controller.store.instances import logfiles
from controller.store.models import modelcache
from controller.store.statedir import StateDir

log = get_logger("reconcile")

OWNER = "RECONCILE_OWNER"  # the local backend's OWNER_MARKER, inside the container
STATE_ID = "RECONCILE_STATE_ID"  # and its STATE_ID_MARKER
NVIDIA_VISIBLE = "NVIDIA_VISIBLE_DEVICES"  # what NVIDIA's container hook passes in

# What `podman run` and `docker run` exit with for their own failures (the runtime's
# error, a command that cannot be invoked, one not found); any other code is the
# container's own (its engine's exit code).
RUNTIME_CODES = frozenset({125, 126, 127})
# The codes of a program that cannot be run, what each means: the runtime's words name
# the path alone (`exec: "/usr/bin/vllm": stat …: no such file or directory`).
NO_PROGRAM = {126: "is not executable", 127: "is not"}
# What a registry says of a pull without credentials (podman; docker), which names no
# next move (docker's "pull access denied … may require 'docker login'" does).
NO_LOGIN = ("authentication required", "no basic auth credentials")
NO_ROOM = "no space left on device"  # a pull that filled the runtime's storage (both say so)
PREPULL_RETRY = 30.0  # seconds before a replacement's image that did not pull is tried again
START_TIMEOUT = 60.0  # seconds from `run` to a main process (a runtime creating layers)
POLL = 0.01  # a look at one small file (the container's id)
SCAN_SHARE = 4.0  # a /proc scan at most every 4 times its own cost: a fifth of a core
KEY_PATTERN = re.compile(r"[0-9a-f]{24}")  # pull_key's
# The pull in the background, its output into the log (the shell's stderr), its exit
# status into the file named first (a pull that failed may leave an older image behind),
# the pid of the subshell that waits for it said.
DETACH = 'rc=$1; shift; { "$@"; echo $? >"$rc"; } </dev/null >&2 & echo $!'
# The runtime's `run`, its exit status written to the file named first once it ends (in
# one rename: a reader never sees it half written) and exited with. The file is there
# from the start, naming the shell (`pid <pid>`): a reader knows a status is coming while
# that shell runs, and none once it is gone (killed with its `run`: the 10 s a pass waited
# for it). Each line ends with the runtime's name (the `run`'s program): the runtime to
# ask of a container no record names. An older version's shell leaves it empty (or the
# name left out); an older version's `run`, no file. The `run` is the shell's child by an
# exec'd subshell while the shell's own stderr is set aside: dash says `Killed` of a child
# a signal ended, on its stderr, which is the engine's log (a `run` killed by hand wrote
# it there, as if the engine had been killed); its own errors go there still.
WAIT_EXIT = (
    'rc=$1; shift; echo "pid $$ $1" >"$rc"; exec 3>&2 2>/dev/null; (exec "$@" 2>&3 3>&-); '
    'code=$?; exec 2>&3 3>&-; echo "$code $1" >"$rc.new"; mv -f "$rc.new" "$rc"; exit $code'
)


def container_name(instance: str, nonce: str) -> str:
    """``reconcile-pool_1-<nonce>``: a replica's ``@`` is not allowed in a container name."""
    return f"reconcile-{instance.replace('@', '_')}-{nonce}"


def exit_file(state_dir: str, instance: str, nonce: str) -> Path:
    """Where the `run` of the instance's container writes its exit status as it ends."""
    name = container_name(instance, nonce)
    return StateDir(Path(state_dir)).container_env(name).with_suffix(".rc")


def exit_status(path: Path) -> int | None:
    """The exit status ``path`` holds (None: none written, or not a number)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def runtime_in(path: Path) -> str | None:
    """The runtime whose `run` the exit file at ``path`` is of (None: not said: an older
    version's file, or none)."""
    try:
        words = path.read_text().split()
    except OSError:
        return None
    rest = words[2:] if words[:1] == ["pid"] else words[1:]  # after its pid, or its code
    return rest[0] if rest and rest[0] in containers.RUNTIMES else None


def run_ended(path: Path) -> bool:
    """The `run` whose exit file is ``path`` has ended (its status written, or its shell
    gone without one); False where no file says (an older version's `run`)."""
    return path.exists() and (exit_status(path) is not None or not status_coming(path))


def status_coming(path: Path) -> bool:
    """The exit file at ``path`` may still get its status: it is there and the shell that
    writes it runs (a file naming none, an older version's, is taken to: as before)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    head, pid, *_ = [*text.split(), "", ""]
    if head != "pid" or not pid.isdigit():
        return True
    st = procstat.stat(int(pid))  # a pid reused meanwhile: waited for, as before
    return st is not None and st.state != "Z"


class Wrapper:
    """Runs one engine in a container; what the local backend asks of it."""

    def __init__(
        self, state_dir: str, node_runtime: str | None, *, static_devices: bool,
        owner: str | None = None, log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES,
    ) -> None:  # fmt: skip
        self.state_dir = state_dir
        self.log_max_bytes = log_max_bytes  # the cap of the runtime's own copy of the output
        self.docker_log_driver = ""  # docker's default log driver, once it answered
        self.owner = owner  # the manifest set whose engines these are (None: no set's)
        self.node_runtime = node_runtime
        # A static inventory (RECONCILE_DEVICES: tests, demos) names no real device.
        self.static_devices = static_devices
        # (runtime, image) -> (id, digest), as the last look of this process found it.
        self.images: dict[tuple[str, str], tuple[str, str]] = {}

    def runtime_of(self, container: Container) -> Runtime:
        return Runtime(container.runtime or containers.default_runtime(self.node_runtime))

    def found(self, runtime: str | None, marker: str) -> ContainerRef | None:
        """The container of the instance ``marker`` names, by its labels (None: none)."""
        return Runtime(containers.default_runtime(runtime or self.node_runtime)).labelled(marker)

    def launch(
        self,
        launch: StartRequest,
        marker: str,
        env: Mapping[str, str],
        main_process: Callable[[], ProcessRef | None],
    ) -> tuple[ProcessRef, ContainerRef, subprocess.Popen[bytes], bool]:
        """Start the container: its main process, what the record keeps of it, the
        runtime's client (the caller reaps it when it ends) and whether a pull of its image
        ended just before (its event is the caller's). ``main_process``: the
        marker's leader now (the container's PID 1 carries the marker in its environment,
        so a look at /proc finds it without asking the runtime again and again)."""
        spec = launch.entry.deployment.spec
        assert spec.container is not None and launch.record.nonce is not None
        runtime = self.runtime_of(spec.container)
        image = container_image(spec)
        _check_volumes(spec.container)
        known = self.ensure_image(runtime, image, spec.container)
        digest, pulled = known.digest, known.pulled
        name = container_name(instance_of(launch.record.name), launch.record.nonce)
        env_file = StateDir(Path(self.state_dir)).container_env(name)
        cid_file = env_file.with_suffix(".cid")  # `run` writes the container's id there
        rc_file = env_file.with_suffix(".rc")  # and its shell its exit status, at its end
        if rc_file.exists():  # an earlier try's of this nonce: not this run's word
            _remove_named(runtime, name)  # nor its container, which would block the name
            _unlink(rc_file)
        hidden = _client_env(launch, env)  # passed through the runtime's own environment
        shown = {k: v for k, v in env.items() if k not in hidden and k != OWNER}
        _write_env(env_file, {**shown, **self._marks()}, marker)
        try:
            whole = Whole(image=image, digest=digest, name=name, marker=marker, hidden=hidden)
            argv = self.whole_argv(runtime.name, launch, whole, env_file)
            offset = _size(launch.log_path)
            client = _start_client([*_waited(rc_file), *argv], launch.log_path, hidden)
            failpoints.hit("container.run.before_wait")
            started = Started(runtime.name, client, launch.log_path, offset)
            ref: ProcessRef | None
            try:
                ref, cid = started.wait(main_process, cid_file)
            except ContainerError as exc:  # the image may be gone: the next start looks again
                self.images.pop((runtime.name, image), None)
                if _remove_named(runtime, name):  # it ended (its code said): not left behind
                    _unlink(rc_file)  # its `run` ended: no engine of this record runs
                if not (known.remembered and containers.absent(str(exc))):
                    program = launch.rendered.argv[0]
                    raise _next_move(exc, client.returncode, spec, program, image) from None
                ref, cid = None, ""  # removed since it was remembered: looked for below
            failpoints.hit("container.run.after_start")
        finally:
            for path in (env_file, cid_file):  # the engine has its environment now
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        if ref is None:  # a fresh look: the image is pulled first, as for a first start
            return self.launch(launch, marker, env, main_process)
        # A remembered image is looked at again once its container runs: the tag may name
        # another image now. Not while it starts: an `image inspect` then waits on the
        # storage lock the runtime's `run` holds, and the `run` on it (measured: the engine
        # answered 35 ms later, nice(1) on the inspect did not help: a lock, not the CPU).
        if known.remembered and self._moved(runtime, image, cid, client):
            return self.launch(launch, marker, env, main_process)  # a fresh look now
        kept = ContainerRef(runtime=runtime.name, id=cid, image=image, digest=digest)
        return ref, kept, client, pulled

    def _moved(
        self,
        runtime: Runtime,
        image: str,
        cid: str,
        client: subprocess.Popen[bytes],
    ) -> bool:
        """The remembered image's tag names another image now: which one runs in ``cid``
        is unknown (its labels may lie), so it is removed and forgotten."""
        if _image_or_none(runtime, image) == self.images.get((runtime.name, image)):
            return False
        self.images.pop((runtime.name, image), None)
        runtime.remove(cid, 0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            client.wait(containers.CALL_TIMEOUT)
        return True

    def prepared(self, spec: DeploymentSpec) -> Held | None:
        """Before a running engine is stopped for ``spec``: None when its image is here
        (or its look fails: the launch decides, as before), else why the running one is
        kept meanwhile. A pull is started as a launch would (``ensure_image``); one that
        ended without the image is said, and tried again after PREPULL_RETRY."""
        assert spec.container is not None
        runtime, image = self.runtime_of(spec.container), container_image(spec)
        job = PullJob.of(Path(self.state_dir), runtime.name, image)
        pulling = f"pulling image {image} ({runtime.name}) first: the running engine serves"
        if job.running():
            return _pulling(job, pulling)
        if spec.container.policy(image) == "Always":
            container = spec.container

            def cannot(said: str) -> str:
                return self._cannot(runtime, container, image, said)

            return _pulled_first(job, pulling, cannot)
        try:
            present = runtime.image(image) is not None
        except ContainerError:  # the runtime does not answer: the launch decides, as before
            return None
        if present:
            return None  # a pull that ended with it: the launch finds it and says so
        if job.exists() and spec.container.policy(image) != "Never":  # ended without it
            # (under Never, a pull an earlier spec made is not this one's word: below)
            said = f"{imagepulls.FAILED}{image}: {job.last_line()}; the running engine is kept"
            return _failed_pull(job, said)
        if spec.container.policy(image) == "Never":
            said = self._never_here(runtime, spec.container, image)
            return Held(f"{said}; the running engine is kept", failed=True)
        job.start()
        return Held(pulling)

    def fetching(self, spec: DeploymentSpec) -> str | None:
        """Why a start of ``spec`` waits for its image (it is not here as pullPolicy wants:
        being pulled, its pull failed, or none ran yet), else None: the planner places it
        only once it is here, so a pull never preempts. Nothing is started or forgotten (a
        look, as `plan`'s). A runtime that does not answer is the launch's to judge, as
        before. A remembered image costs no `image inspect`. Under ``Never``, an image not
        here is waited for too: placed, its start wrote a `start` line in the engine's log
        for a run that never was, each pass."""
        assert spec.container is not None
        runtime, image = self.runtime_of(spec.container), container_image(spec)
        policy = spec.container.policy(image)
        if policy == "Never":  # never pulls: an ended pull was an earlier spec's, not its word
            if self._here(runtime, image):
                return None
            return f"{self._never_here(runtime, spec.container, image)}, or set pullPolicy"
        job = PullJob.of(Path(self.state_dir), runtime.name, image)
        if job.running():
            return f"pulling image {image} ({runtime.name}): {job.last_line()}"
        if job.exists():  # ended: with it (the launch reads it), or with the runtime's words
            if not job.failed():
                return None
            return self._cannot(runtime, spec.container, image, job.last_line())
        if policy == "Always":
            return f"pulling image {image} ({runtime.name})"  # it runs only what it pulls
        return None if self._here(runtime, image) else f"pulling image {image} ({runtime.name})"

    def _here(self, runtime: Runtime, image: str) -> bool:
        """The image is on this node, remembered or looked at now (a runtime that does not
        answer: as if here, for the launch to judge)."""
        if (runtime.name, image) in self.images:
            return True
        try:
            facts = runtime.image(image)
        except ContainerError:
            return True
        if facts is None:
            return False
        self.images[(runtime.name, image)] = facts  # the launch looks again once it runs
        return True

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        """Fetch what ``fetching`` found missing, holding nothing: None when the image is
        here now (the next round places the start), else the wait (its pull started, or
        running), or the pull's failure (``failed``: read once, the job forgotten so the
        retry after the back-off pulls again)."""
        assert spec.container is not None
        runtime, image = self.runtime_of(spec.container), container_image(spec)
        job = PullJob.of(Path(self.state_dir), runtime.name, image)
        waits = self.fetching(spec)
        if waits is None:  # here (a pull that ended with it: the launch reads it)
            return None
        if spec.container.policy(image) == "Never":  # nothing fetches it: Pending until here
            if job.exists() and not job.running():
                job.forget()  # an earlier spec's ended pull: not this one's word, ever
            return Held(waits, pending=True)
        if job.running():
            return Held(waits)
        if job.exists():  # ended without it
            said = self._cannot(runtime, spec.container, image, job.last_line())
            job.forget()
            return Held(said, failed=True)
        job.start()
        return Held(f"pulling image {image} ({runtime.name})")

    def drop_unused_pulls(self, specs: Iterable[DeploymentSpec]) -> int:
        """Forget the ended image pulls none of ``specs`` runs from; how many. A job is
        read (and forgotten) by the next start of its image; one whose image was edited
        away before that start stayed in ``<state>/images/`` for good."""
        named = {self._pull_key(spec) for spec in specs if spec.container is not None}
        dropped = 0
        for job in PullJob.found(Path(self.state_dir)):
            if job.key not in named and not job.running():
                job.forget()
                dropped += 1
        return dropped

    def drop_unused_env_files(self, records: Callable[[], Iterable[Record]]) -> int:
        """Remove this set's ``run/<container>.env`` (and ``.cid``) files that no start in
        flight reads; how many. A start unlinks its own when `run` returns; one SIGKILLed
        meanwhile left its file (spec.env's values) for good. ``records`` are read once the
        files are listed: a start in flight wrote its record (its nonce, its live maker)
        before its file, so it is seen; a container once created has read its file. And
        the exit files no record names (:func:`_drop_unread_exits`)."""
        runs = StateDir(Path(self.state_dir)).runs
        listed = sorted(runs.glob("reconcile-*.env"))
        if not listed:
            return self._drop_unread_exits(runs, records)
        starting = {r.nonce for r in records() if r.ref is None and process_alive(r.reserved_by)}
        dropped = 0
        for env_file in listed:
            nonce = env_file.stem.rpartition("-")[2]
            if nonce in starting or _owner_in(env_file) != (self.owner, True):
                continue  # another set's file is that set's to judge
            for path in (env_file, env_file.with_suffix(".cid")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            dropped += 1
        return dropped + self._drop_unread_exits(runs, records)

    def _drop_unread_exits(self, runs: Path, records: Callable[[], Iterable[Record]]) -> int:
        """Remove the exit files (``run/<container>.rc``) of engines no record names any
        more, as its run or as the one before it still to read (``Record.unread_exit``)
        (a `run` that ended after its record's teardown had looked; a crash of ours
        between an engine's start and its record, or between its end and its teardown),
        with the container each names once it has ended (it is no one's to read); how many.
        One whose container still runs (an orphan the pass reaps), or whose runtime does
        not answer, is kept for a later pass: so no container is left behind."""
        listed = sorted(runs.glob("reconcile-*.rc"))
        if not listed:
            return 0
        named = list(records())  # a run restarted unread is its record's still (lateexits)
        nonces = {r.nonce for r in named} | {r.unread_exit.nonce for r in named if r.unread_exit}
        dropped = 0
        for path in listed:
            if path.stem.rpartition("-")[2] not in nonces and self._forget(path):
                _unlink(path)
                dropped += 1
        return dropped

    def _forget(self, exit_path: Path) -> bool:
        """The container the exit file names removed if it ended and is this state dir's
        (its label and marker say so); whether nothing of it is left to remove."""
        runtime = runtime_in(exit_path)
        if runtime is None:  # an older version's: its `run --rm` has the runtime remove it
            return True
        mine = containers.Ours(self.state_dir, STATE_ID, stateid.peek(Path(self.state_dir)))
        return Runtime(runtime).remove_ended(exit_path.stem, mine)

    def _pull_key(self, spec: DeploymentSpec) -> str:
        assert spec.container is not None
        return pull_key(self.runtime_of(spec.container).name, container_image(spec))

    def ensure_image(self, runtime: Runtime, image: str, container: Container) -> Known:
        """The image on this node as pullPolicy says: its digest, whether it was pulled
        (a pull job of this image ended with it), and whether it is the one remembered
        from an earlier start of this process (``images``), not looked at now.

        Remembered, because an `image inspect` is a fork and exec of a Go binary (0.1 to
        0.2 s measured on a busy host), a fifth of a container's start; the launch looks
        again once the container runs and starts it again if the image changed.

        A pull is a declared step, as a model pull: it runs in a process of its own (the
        runtime's ``pull``, its output in ``<state>/images/``) and the start waits for it
        holding nothing (PullingFirst: the record is Pulling, no device, no port); the
        next pass finds it again by the job file. A pull that ended without the image is
        an ImagePullFailed in the runtime's own words, retried with the usual back-off
        (holding nothing meanwhile: the launcher gives the lease back).
        """
        job = PullJob.of(Path(self.state_dir), runtime.name, image)
        if job.running():
            raise PullingFirst(f"pulling image {image} ({runtime.name}): {job.last_line()}")
        policy = container.policy(image)
        remembered = self.images.get((runtime.name, image))
        if remembered is not None and policy != "Always" and not job.exists():
            return Known(remembered[1], pulled=False, remembered=True)
        facts = runtime.image(image)  # (id, digest) when on this node
        self.images.pop((runtime.name, image), None)
        if facts is not None:
            self.images[(runtime.name, image)] = facts
        present = facts is not None
        if job.exists():  # it ended: with the image, or with the runtime's words
            said, failed = job.last_line(), job.failed()
            job.forget()
            if facts is not None and not failed:
                return Known(facts[1], pulled=True)
            # Always runs only what it pulled (Kubernetes' ErrImagePull), never the copy a
            # failed pull left; the others run an image that is here, however it came.
            if policy == "Always" or (facts is None and policy != "Never"):
                raise ImagePullFailed(self._cannot(runtime, container, image, said))
            # Never pulls: that pull was an earlier spec's (pullPolicy edited since), and
            # its error is not this spec's word; Never's own is, below.
        if policy == "Never" and not present:
            raise Unplaceable(f"{self._never_here(runtime, container, image)}, or set pullPolicy")
        if facts is not None and policy != "Always":
            return Known(facts[1], pulled=False)
        job.start()
        raise PullingFirst(f"pulling image {image} ({runtime.name})")

    def _cannot(self, runtime: Runtime, container: Container, image: str, said: str) -> str:
        """A failed pull of the container's image in the runtime's words (``said``); and,
        when the image is on this node all the same, why it was pulled and how to run it:
        an image built here has no tag, or `:latest`, for which pullPolicy defaults to
        Always (Kubernetes'), and its pull fails where no registry has it."""
        text = f"{imagepulls.FAILED}{image}: {said}"
        if any(words in said.lower() for words in NO_LOGIN):  # the pull used the runtime's own
            login = " ".join((runtime.name, "login", _registry(image))).strip()
            return f"{text}; log in as the user reconcile runs as: `{login}`"
        if NO_ROOM in said.lower():  # neither the name nor the registry is at fault
            where, rt = runtime.storage() or f"{runtime.name}'s image storage", runtime.name
            room = f"`{rt} system df` shows what uses it, `{rt} image prune` removes unused images"
            return f"{text}; {where} is full: free space there ({room}): the pull is tried again"
        defaulted = container.pull_policy is None and container.policy(image) == "Always"
        if defaulted and _image_or_none(runtime, image) is not None:
            return text + (
                "; it is on this node, but pullPolicy defaults to Always for `:latest` "
                "or no tag: set pullPolicy: IfNotPresent to run it, or tag it with a version"
            )
        if other := self._other_has(runtime, container, image):
            return f"{text}; {other}"
        # A name, tag or digest mistyped, or a registry down: the runtime's words say
        # which, and named no next move (`manifest unknown`, `connection refused`).
        return text + (
            f"; check spec.container.image (`{runtime.name} images` lists this node's) "
            "and that its registry answers: the pull is tried again"
        )

    def _never_here(self, runtime: Runtime, container: Container, image: str) -> str:
        """An image ``pullPolicy: Never`` will not pull, missing: and what to do."""
        if other := self._other_has(runtime, container, image):
            return (
                f"image {image} is not in {runtime.name}'s images and {imagepulls.NEVER}: {other}"
            )
        return (
            f"image {image} is not on this node and {imagepulls.NEVER}: "
            f"`{runtime.name} pull {image}` (or load it)"
        )

    def _other_has(self, runtime: Runtime, container: Container, image: str) -> str:
        """Where no runtime was named (spec, node.yaml) and the default one (podman, when
        on PATH) lacks the image: whether the other one holds it, and what to set then
        (else ""). An image built or loaded with docker on a node that has both was said
        "not on this node"."""
        if container.runtime or self.node_runtime:
            return ""
        other = Runtime(next(name for name in containers.RUNTIMES if name != runtime.name))
        try:  # one look (a hint, not a decision): asked again at the next pass
            held = other.call("image", "inspect", "--format", "{{.Id}}", image).returncode == 0
        except ContainerError:  # not installed, or no answer
            return ""
        if not held:
            return ""
        return (
            f"{other.name} has it ({runtime.name} is the default where both are installed): "
            f"set spec.container.runtime: {other.name} (or node.yaml containerRuntime)"
        )

    def whole_argv(
        self, runtime: str, launch: StartRequest, whole: Whole, env_file: Path
    ) -> list[str]:
        """The `run` a start gives the runtime (``launch`` runs it, ``plan`` shows it)."""
        spec = launch.entry.deployment.spec
        image, name, marker = whole.image, whole.name, whole.marker
        argv = self.run_argv(runtime, spec, launch, image, name, marker, env_file)
        # `--env KEY` alone: the runtime takes KEY's value from its own environment.
        argv[2:2] = [arg for key in sorted(whole.hidden) for arg in ("--env", key)]
        # What adopting it after a crash must know again, which `inspect` cannot say
        # as the manifest wrote it (podman completes an image's name).
        argv[2:2] = ["--label", f"{containers.IMAGE_LABEL}={image}"]
        argv[2:2] = ["--label", f"{containers.DIGEST_LABEL}={whole.digest}"]
        argv[2:2] = ["--cidfile", str(env_file.with_suffix(".cid"))]
        return argv

    def command_line(self, launch: StartRequest, marker: str, env: Mapping[str, str]) -> list[str]:
        """What a start of ``launch`` would give the runtime, for `reconcile plan`: the
        argv `launch` builds, the image's digest as the runtime has it now (a look, never
        a pull: ``<digest>`` when unknown), the env file's path where its values go."""
        spec = launch.entry.deployment.spec
        assert spec.container is not None and launch.record.nonce is not None
        runtime = self.runtime_of(spec.container)
        image = container_image(spec)
        known = self.images.get((runtime.name, image)) or _image_or_none(runtime, image)
        name = container_name(instance_of(launch.record.name), launch.record.nonce)
        env_file = StateDir(Path(self.state_dir)).container_env(name)
        hidden = _client_env(launch, env)
        digest = known[1] if known is not None else "<digest>"
        whole = Whole(image=image, digest=digest, name=name, marker=marker, hidden=hidden)
        return self.whole_argv(runtime.name, launch, whole, env_file)

    def run_argv(
        self,
        runtime: str,
        spec: DeploymentSpec,
        launch: StartRequest,
        image: str,
        name: str,
        marker: str,
        env_file: Path,
    ) -> list[str]:
        assert spec.container is not None
        argv = [runtime, "run", "--name", name, "--network", "host", "--pull", "never"]
        argv += ["--label", f"{containers.INSTANCE_LABEL}={marker}"]
        argv += ["--label", f"{containers.STATE_LABEL}={self.state_dir}"]
        if self.owner is not None:
            argv += ["--label", f"{containers.OWNER_LABEL}={self.owner}"]
        argv += ["--env-file", str(env_file), "--stop-signal", str(launch.rendered.stop_signal)]
        # The runtime's own stops (`docker stop` by hand, its daemon's shutdown) give the
        # spec's grace too, not their default 10 s (vLLM takes 10-30 s to stop).
        argv += ["--stop-timeout", containers.stop_seconds(launch.rendered.grace_seconds)]
        argv += self._log_cap(runtime)
        if spec.container.shm_size is not None:
            argv += ["--shm-size", str(spec.container.shm_size)]
        for volume in (*spec.container.volumes, *self._read_only_mounts(spec)):
            argv += ["--volume", volume]
        if not self.static_devices:
            argv += device_flags(runtime, Passed.of(launch.record.devices))
        program, *args = launch.rendered.argv
        return [*argv, "--entrypoint", program, image, *args]

    def _log_cap(self, runtime: str) -> list[str]:
        """``--log-opt max-size``: the runtime keeps its own copy of the engine's output
        for the container's life (read by `reconcile logs` only once the `run` is gone),
        unbounded by default (podman's k8s-file, docker's json-file): a talkative engine
        filled the disk through it while reconcile's log rotated. Capped at logMaxBytes,
        as reconcile's is. podman takes the option with any driver (its conmon applies it
        to a file); docker refuses it for one without files (journald, syslog...)."""
        if runtime == "docker":
            # Asked once it answers (a daemon down now says nothing: its `run` fails too).
            self.docker_log_driver = self.docker_log_driver or Runtime(runtime).log_driver()
            if self.docker_log_driver not in containers.SIZED_LOG_DRIVERS:
                return []
        return ["--log-opt", f"max-size={self.log_max_bytes}"]

    def _marks(self) -> dict[str, str]:
        """The marker's variables besides ``RECONCILE_INSTANCE``: whose engine it is."""
        marks = {"RECONCILE_STATE": self.state_dir}
        known = stateid.peek(Path(self.state_dir))
        if known is not None:
            marks[STATE_ID] = known
        if self.owner is not None:
            marks[OWNER] = self.owner
        return marks

    def _read_only_mounts(self, spec: DeploymentSpec) -> list[str]:
        """The model cache, and a local spec.model's folder, at the same paths, read-only,
        unless a volume already covers them (``{model}`` then names the same file)."""
        assert spec.container is not None
        wanted = [str(modelcache.cache_root(Path(self.state_dir)).resolve())]
        if spec.model and spec.model.startswith("/"):
            model = Path(spec.model)
            wanted.append(str(model if model.is_dir() else model.parent))
        covered = [v.split(":")[1] for v in spec.container.volumes]
        mounts = []
        for path in wanted:
            inside = any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered)
            if not inside and os.path.isdir(path):
                mounts.append(f"{path}:{path}:ro")
        return mounts


@dataclass(frozen=True, slots=True)
class Whole:
    """What a container's `run` names beside the spec: its image and the digest it was
    found at, its name and marker, the variables the runtime passes from its own
    environment (``_client_env``: their values never in a file or an argv)."""

    image: str
    digest: str
    name: str
    marker: str
    hidden: Mapping[str, str]


def _pulled_first(job: PullJob, pulling: str, cannot: Callable[[str], str]) -> Held | None:
    """Under ``pullPolicy: Always`` the new spec runs only what a pull brings (an older
    copy on the node is no answer), so its pull comes first while the running engine
    serves; one that ended well is the launch's to read, one that failed keeps it."""
    if not job.exists():
        job.start()
        return Held(pulling)
    if not job.failed():
        return None
    return _failed_pull(job, f"{cannot(job.last_line())}; the running engine is kept")


def _failed_pull(job: PullJob, said: str) -> Held:
    """A replacement's pull that ended without its image keeps the running engine, and
    is pulled again after PREPULL_RETRY: at once, its failure kept beside the new pull,
    so the deployment's condition stays while it runs (as Kubernetes keeps
    ImagePullBackOff shown) rather than going for each retry and coming back."""
    if job.age() < PREPULL_RETRY:
        return Held(said, failed=True)
    job.retry(said)
    return Held(f"{said}{imagepulls.RETRYING}", failed=True)


def _pulling(job: PullJob, pulling: str) -> Held:
    """A replacement's pull that runs: a retry still says the failure it retries."""
    before = job.failed_before()
    if before is None:
        return Held(pulling)
    return Held(f"{before}{imagepulls.RETRYING}", failed=True)


@dataclass(frozen=True, slots=True)
class Known:
    """What a launch knows of its image before it runs it."""

    digest: str
    pulled: bool  # a pull job of it ended just before
    remembered: bool = False  # from an earlier look of this process: to be checked again


def _next_move(
    exc: ContainerError, code: int | None, spec: DeploymentSpec, program: str, image: str
) -> ContainerError:
    """``exc``, with what to set where the runtime's words name a path alone: a program
    the image lacks, or a volume's host folder this node lacks (podman refuses it with
    `statfs …: no such file or directory`). An engine's own exit is its restart policy's."""
    if isinstance(exc, ContainerExited):
        return exc
    said = NO_PROGRAM.get(code) if code is not None else None
    if said is not None and _about_the_program(str(exc)):
        field = "spec.command[0]" if spec.engine == "command" else "spec.executable"
        return ContainerError(
            f"{exc}: {program} {said} in image {image}: set {field} to the program's path "
            "inside the image, or use an image that has it"
        )
    assert spec.container is not None
    missing = containers.missing_volume(spec.container.volumes)  # gone since the check
    if missing is not None:
        index, host = missing
        said = containers.missing_folder(host)
        return ContainerError(f"{exc}: spec.container.volumes[{index}]: {said}")
    return exc


def _about_the_program(words: str) -> bool:
    """Exit 126 or 127 is also a runtime's for a start refused before the program (runc
    not allowed to set the rlimits: "operation not permitted: OCI permission denied"):
    the missing-program hint only where the runtime's words are about its exec (runc's
    and docker's `exec: "/bin/x": ...`, crun's `open executable`)."""
    return "exec" in words.lower()


def _check_volumes(container: Container) -> None:
    """Every volume's host path is on this node (the pass checked; a Ray node's are
    checked here): a missing one is never made, by docker or anyone."""
    missing = containers.missing_volume(container.volumes)
    if missing is not None:
        index, host = missing
        said = containers.missing_folder(host)
        raise ContainerError(f"spec.container.volumes[{index}]: {said}")


def _registry(image: str) -> str:
    """The registry host a reference names (its first part, when that is a host), else ""
    (the runtime's default registry, which `login` alone logs in to)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return ""


def _image_or_none(runtime: Runtime, image: str) -> tuple[str, str] | None:
    try:
        return runtime.image(image)
    except ContainerError:  # the runtime did not answer: not the remembered image
        return None


@dataclass(frozen=True, slots=True)
class Passed:
    """A record's devices as the container runtimes name them.

    A record names its devices ``nvidia:1`` / ``amd:0`` (the inventory's keys); a Ray
    actor's are the bare indices ``ray.get_gpu_ids()`` gave (nvidia). The runtimes want
    the NVML index: CDI's ``nvidia.com/gpu=1`` (the name ``nvidia-ctk cdi generate``
    gives each GPU) and docker's ``--gpus "device=1"`` (which docker hands to CDI or to
    NVIDIA's hook). Passing ``nvidia:1`` was refused: "unresolvable CDI devices"."""

    nvidia: tuple[str, ...] = ()
    amd: bool = False

    @classmethod
    def of(cls, devices: Iterable[str]) -> Passed:
        nvidia: list[str] = []
        amd = False
        for device in devices:
            kind, sep, ident = device.partition(":")
            if not sep:  # a Ray actor's GPU index
                kind, ident = "nvidia", device
            if kind == "nvidia":
                nvidia.append(ident)
            amd |= kind == "amd"
        return cls(tuple(nvidia), amd)


def device_flags(runtime: str, passed: Passed) -> list[str]:
    """nvidia through CDI (podman) or ``--gpus`` (docker): only the leased GPUs, which the
    container numbers from 0; amd through ``/dev/kfd`` and all of ``/dev/dri`` (docker's
    and ROCm's own advice), where the container numbers every GPU as the host does and
    ``HIP_VISIBLE_DEVICES`` keeps the leased ones."""
    flags: list[str] = []
    if passed.nvidia and runtime == "podman":
        flags += [arg for i in passed.nvidia for arg in ("--device", f"nvidia.com/gpu={i}")]
    elif passed.nvidia:
        flags += ["--gpus", f'"device={",".join(passed.nvidia)}"']  # docker's own quoting
    if passed.amd:
        flags += ["--device", "/dev/kfd", "--device", "/dev/dri"]
    return flags


def container_env(rendered: Mapping[str, str], passed: Passed | None) -> dict[str, str]:
    """The engine's environment inside: the rendered one only (never the host's PATH or
    HOME, which would break the image). ``passed``: the devices passed in (None: a static
    inventory passes none). The nvidia GPUs passed are numbered from 0 there; the amd
    ones keep the host's numbers (every render node is passed, see ``device_flags``).

    ``NVIDIA_VISIBLE_DEVICES`` names the leased GPUs (none: ``void``) unless spec.env
    sets it: CUDA images set it to ``all``, and NVIDIA's OCI hook (a host where
    nvidia-container-toolkit's hook runs for every container) passes every GPU it names,
    beside the leased ones CDI passed; the engine's GPU "0" was then the host's first,
    another deployment's (what Kubernetes' device plugin sets it to, for the same reason)."""
    env = dict(rendered)
    if passed is not None and passed.nvidia and env.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(passed.nvidia)))
    if passed is not None:
        env.setdefault(NVIDIA_VISIBLE, ",".join(passed.nvidia) or "void")
    return env


def _write_env(path: Path, env: Mapping[str, str], marker: str) -> None:
    """KEY=VALUE lines, 0600, read by `run --env-file`: values never reach an argv."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k}={v}" for k, v in env.items() if _one_line(v)]
    lines.append(f"RECONCILE_INSTANCE={marker}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")


def _owner_in(env_file: Path) -> tuple[str | None, bool]:
    """The owner an env file names (None: no set's) and whether it was read at all (one
    gone meanwhile, or unreadable, is left alone)."""
    try:
        lines = env_file.read_text(errors="replace").splitlines()
    except OSError:
        return None, False
    prefix = f"{OWNER}="
    owners = [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]
    return (owners[0] if owners else None), True


def _client_env(launch: StartRequest, env: Mapping[str, str]) -> dict[str, str]:
    """The variables the runtime's `run` takes from its own environment (``--env KEY``):
    those whose values came from spec.envFrom (spec.env may override one), never to be in
    a file or an argv, and any value with a newline or a carriage return, which no line
    of ``--env-file`` holds whole (a PEM certificate in spec.env reached the engine empty)."""
    secret = {k: v for k, v in launch.entry.secret_env.items() if env.get(k) == v}
    lines = {k: v for k, v in env.items() if not _one_line(v) and k != OWNER}
    return {**lines, **secret}


def _one_line(value: str) -> bool:
    """A value a line of ``--env-file`` holds as it is: no newline, and no carriage
    return, which both runtimes take for a line's end (``token\\r`` reached the engine as
    ``token``)."""
    return "\n" not in value and "\r" not in value


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _start_client(
    argv: list[str], log_path: Path, secret_env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """The runtime's `run`, with the values `--env KEY` passes in its own environment."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this pass, as the engine does
            close_fds=True,
            env={**os.environ, **secret_env} if secret_env else None,
        )
    except OSError as exc:
        raise ContainerError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    finally:
        os.close(log_fd)


@dataclass(frozen=True, slots=True)
class Started:
    """A runtime's `run` just started: wait for its container's main process."""

    runtime: str
    client: subprocess.Popen[bytes]
    log_path: Path
    offset: int  # where this run's output begins in the log

    def wait(
        self, main_process: Callable[[], ProcessRef | None], cid_file: Path
    ) -> tuple[ProcessRef, str]:
        """The main process and the container id; the runtime's words if `run` ended.

        The id first (a stat): the runtime writes it once the container is created, before
        it starts, so the /proc scan (milliseconds of CPU each) runs only for the last
        part, and never more than a fifth of the time: on a busy host every scan takes CPU
        from the runtime starting the container (measured: ~40 scans of 8 ms in a 0.6 s
        start on two cores)."""
        deadline = time.monotonic() + START_TIMEOUT
        cid = ""
        while time.monotonic() < deadline:
            cid = cid or _read(cid_file)
            pause = POLL
            if cid:
                began = time.monotonic()
                ref = main_process()
                if ref is not None:
                    return ref, cid
                pause = max(POLL, SCAN_SHARE * (time.monotonic() - began))
            if self.client.poll() is not None:
                said = logfiles.read_from(self.log_path, self.offset)
                text = containers.words(said[0].decode(errors="replace") if said else "")
                code = self.client.returncode
                if (cid or _read(cid_file)) and code not in RUNTIME_CODES:
                    raise ContainerExited(code, text)  # it ran: the engine's own exit
                raise ContainerError(f"{self.runtime} run: {text}")
            time.sleep(pause)
        with contextlib.suppress(ProcessLookupError):  # the shell and the `run` it waits on
            os.killpg(self.client.pid, signal.SIGKILL)
        raise ContainerError(
            f"{self.runtime} run: no container running after {START_TIMEOUT:.0f} s"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _waited(rc_file: Path) -> list[str]:
    """The shell that runs the `run` after it and writes its exit status to ``rc_file``."""
    return ["/bin/sh", "-c", WAIT_EXIT, "sh", str(rc_file)]


def _remove_named(runtime: Runtime, name: str) -> bool:
    """Remove this start's container (its name is its nonce's), whatever its state:
    whether none is left (False: the runtime did not answer; said in the log)."""
    try:
        runtime.remove(name, 0)
    except ContainerError as exc:
        log.warning("container not removed: a later pass removes it", container=name,
                    reason=str(exc))  # fmt: skip
        return False
    return True


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class PullJob:
    """One image pull in a process of its own: ``<state>/images/<key>.json`` (its pid
    and start time) and ``<key>.log`` (the runtime's output: progress, then its words)."""

    def __init__(self, state_dir: Path, key: str, argv: Sequence[str] = ()) -> None:
        """The job named ``key`` (:func:`pull_key`); ``argv``: the pull that starts it."""
        state = StateDir(state_dir)
        self.key = key
        self.folder = state.images
        self.doc = Document(state, self.folder / f"{key}.json", _decode_pull, _encode_pull)
        self.file = self.doc.path
        self.log = self.folder / f"{key}.log"
        self.status = self.folder / f"{key}.rc"  # the pull's exit status, once it ended
        self.before = self.folder / f"{key}.failed"  # what the pull a retry follows said
        self.argv = list(argv)

    @classmethod
    def of(cls, state_dir: Path, runtime: str, image: str) -> PullJob:
        return cls(state_dir, pull_key(runtime, image), [runtime, "pull", image])

    @classmethod
    def found(cls, state_dir: Path) -> list[PullJob]:
        """Every job in ``<state>/images/``, started or ended, by its key (the image is
        known only by that digest). Other files there (a Ray driver's) are not jobs."""
        files = sorted(StateDir(state_dir).images.glob("*.json"))
        return [cls(state_dir, f.stem) for f in files if KEY_PATTERN.fullmatch(f.stem)]

    def exists(self) -> bool:
        return self.file.exists()

    def running(self) -> bool:
        ref = self.doc.read()  # a torn file: set aside (named), the pull is not running
        if ref is None:
            return False
        return process_alive(ref)  # not a zombie: ended pulls are reparented, maybe unreaped

    def start(self) -> None:
        """The runtime's ``pull``, started by a shell that leaves it running and says its
        pid: so the pull is no child of this process. On a Ray node the actor that starts
        it ends at once (the start waits, holding nothing) and Ray kills an ending
        worker's children (``kill_child_processes_on_worker_exit``), which ended every
        image pull there before it began (tests/ray/test_ray_container.py)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for earlier in (self.status, self.before):  # an earlier pull's: not this one's word
            with contextlib.suppress(FileNotFoundError):
                earlier.unlink()
        log_fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            shell = subprocess.run(
                ["/bin/sh", "-c", DETACH, "sh", str(self.status), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_fd,  # the pull's output and its words, and the shell's own
                start_new_session=True,  # outlives this pass, as a model pull does
                close_fds=True,
                timeout=containers.CALL_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ContainerError(f"cannot run {self.argv[0]!r}: {exc}") from exc
        finally:
            os.close(log_fd)
        pid = int(shell.stdout.strip() or 0)
        ref = identity(pid) if pid > 0 else None
        self.doc.write(ref or ProcessRef(pid=pid, start_time=time.time()))

    def failed(self) -> bool:
        """The ended pull exited non-zero (no status: one that was killed, or started by
        an earlier version: its image's presence alone decides, as before)."""
        try:
            return self.status.read_text().strip() not in ("", "0")
        except OSError:
            return False

    def last_line(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "starting"
        if not text.strip():
            return "starting"  # nothing said yet (docker prints its first layer later)
        return containers.words(text.replace("\r", "\n"))

    def age(self) -> float:
        """Seconds since the pull last wrote (its end, for one that ended)."""
        try:
            return time.time() - self.log.stat().st_mtime
        except OSError:
            return 0.0

    def retry(self, said: str) -> None:
        """Pull again now, keeping ``said`` (the failure it retries) beside the new pull,
        read while it runs: ``failed_before``."""
        self.forget()
        self.start()
        self.before.write_text(said)

    def failed_before(self) -> str | None:
        """What the failed pull this one retries said, if it is a retry."""
        try:
            return self.before.read_text() or None
        except OSError:
            return None

    def forget(self) -> None:
        for path in (self.file, self.log, self.status, self.before):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def pull_key(runtime: str, image: str) -> str:
    """The name of an image pull's files: the same image by another runtime is another pull."""
    return sha256_hex(f"{runtime}\0{image}".encode())[:24]


def _decode_pull(data: Any) -> ProcessRef:
    return ProcessRef(pid=int(data["pid"]), start_time=float(data["start_time"]))


def _encode_pull(ref: ProcessRef) -> dict[str, Any]:
    return {"pid": ref.pid, "start_time": ref.start_time}
