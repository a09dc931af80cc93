"""Podman and docker, driven through their command lines (DESIGN.md "Engines in containers").

Why the CLIs and not their APIs: podman needs no daemon at all (its REST service is an
extra process to run), both take the same ``run`` flags, and an error the user sees is
the runtime's own words, the ones its docs and forums answer. A call is a fork and exec
of a Go binary (tens of ms), made only when an engine starts, stops or is looked for.

Every container we run carries the labels ``reconcile.instance`` (the marker),
``reconcile.state`` (the state dir's real path) and ``reconcile.owner`` (the manifest set
that started it): that is how a container is ours, and whose.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.state import ContainerRef
from controller.errors import ContainerError

RUNTIMES = ("podman", "docker")
INSTANCE_LABEL = "reconcile.instance"
STATE_LABEL = "reconcile.state"
OWNER_LABEL = "reconcile.owner"  # the manifest set that started it (older engines: none)
IMAGE_LABEL = "reconcile.image"  # the image as the manifest wrote it
DIGEST_LABEL = "reconcile.digest"  # the digest it was run from
CALL_TIMEOUT = 60.0  # seconds for one CLI call other than a pull (a stop adds its grace)
POLL = 0.05
# The processes that hold a container's published port on the host: podman's conmon
# (rootful) and rootlessport (rootless), docker's userland proxy.
PORT_PROXIES = {"conmon": "podman", "rootlessport": "podman", "docker-proxy": "docker"}
# docker's log drivers that keep the output in files and take `--log-opt max-size`.
SIZED_LOG_DRIVERS = frozenset({"json-file", "local"})
PUBLISHER_TIMEOUT = 10.0  # seconds for `ps`: a hung runtime must not hold the pass
# What the runtime says is not there is believed after LOOKS looks, LOOK_PAUSE s apart:
# podman (4.3 here) answers "image not known" for an image it holds, and "no such
# container" for a running container, while another image sharing its layers is imported
# or removed (measured: ~1 inspect in 100 under such churn, once twice in a row). Taken
# for absent, a local image was "pulled" and its start failed (a CI flake); a container
# still there would be left running past its removal.
LOOKS = 3
LOOK_PAUSE = 0.2  # seconds: what a missing image costs before its pull, a removal at its end
# Seconds a container's end is waited for in its runtime's events while the container is
# still there or the runtime does not answer: docker's daemon, restarted under running
# containers, stops them before it answers (a `run`'s clean-up on a busy host: as long).
DIED_WAIT = 10.0
# The states of a container that ran and ended (podman's and docker's words): its State
# keeps the exit code until it is removed.
ENDED = frozenset({"exited", "stopped"})
# Seconds before a container's start its events are read from: its main process's start
# time, read from /proc against the boot time, moves with a step of the clock.
SINCE_SLACK = 60.0
# What docker prints after its error: "Run 'docker run --help' for more information".
TRAILER = re.compile(r"(Run|See) '(docker|podman) [\w -]*--help'")
# A line of podman's log (logrus' text format): what it says is its quoted msg.
LOGRUS = re.compile(r'time="[^"]*" level=\w+ msg="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Ended:
    """How a container ended, as its runtime says: its main process's exit code, and
    whether the kernel's OOM killer ended it (its memory limit, ``--memory``)."""

    code: int
    oom_killed: bool = False


@dataclass(frozen=True, slots=True)
class Running:
    """What ``inspect`` says of a container."""

    id: str
    pid: int  # its main process on this host (0: not running)
    status: str  # created, running, exited...
    image_id: str


@dataclass(frozen=True, slots=True)
class Ours:
    """What makes a container a state dir's: its ``reconcile.state`` label (the state
    dir's path) and, where it carries one, the state dir's id in its environment (another
    state dir at the same path, a disk not mounted, is not this one)."""

    state_dir: str
    id_variable: str  # the variable that carries the state dir's id
    state_id: str | None  # this state dir's (None: none made yet)

    def holds(self, labels: str, env: str) -> bool:
        """Whether a container with these labels and environment (``inspect``'s JSON) is
        this state dir's."""
        try:
            label_map = json.loads(labels or "null") or {}
            variables = json.loads(env or "null") or []
        except ValueError:
            return False
        if not isinstance(label_map, dict) or label_map.get(STATE_LABEL) != self.state_dir:
            return False
        prefix = f"{self.id_variable}="
        said = [str(v)[len(prefix) :] for v in variables if str(v).startswith(prefix)]
        return not said or said[0] == self.state_id


def default_runtime(node_default: str | None) -> str:
    """node.yaml's containerRuntime, else podman if on PATH, else docker."""
    if node_default:
        return node_default
    return "podman" if shutil.which("podman") else "docker"


class Runtime:
    """One runtime's CLI (``podman`` or ``docker``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self, *args: str, timeout: float = CALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """One CLI call; its output as text. A missing program is a ContainerError."""
        try:
            return subprocess.run(
                [self.name, *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise ContainerError(
                f"{self.name} is not installed on this node: install it, or set "
                "spec.container.runtime (or node.yaml containerRuntime) to the other one"
            ) from None
        except subprocess.TimeoutExpired:
            raise ContainerError(
                f"`{self.name} {args[0]}` did not answer in {timeout:.0f} s"
            ) from None

    # -- images ----------------------------------------------------------------------

    def image(self, image: str) -> tuple[str, str] | None:
        """The local image's id and digest (None: not on this node). The digest is the
        registry digest it was pulled by (``sha256:…``), else its local id. A runtime that
        cannot say (docker's daemon down) is a ContainerError in its words, not an image
        to pull: a pull would only fail the same way, under the wrong name."""
        # podman's .Digest: the manifest the image was made with (docker has no such field)
        fmt = "{{.Id}}|{{json .RepoDigests}}" + ("|{{.Digest}}" if self.name == "podman" else "")
        for look in range(LOOKS):
            if look:
                time.sleep(LOOK_PAUSE)
            done = self.call("image", "inspect", "--format", fmt, image)
            if done.returncode == 0:
                break
        else:
            if not absent(done.stderr):
                raise ContainerError(f"{self.name} image inspect: {words(done.stderr)}")
            return None
        image_id, _, listed = done.stdout.strip().partition("|")
        image_id = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
        if "@" in image:  # pinned: that is the digest it was pulled by
            return image_id, image.split("@", 1)[1]
        repo_digests, _, made_with = listed.partition("|")
        return image_id, _pulled_by(image, repo_digests, made_with) or image_id

    def storage(self) -> str:
        """Where the runtime keeps its images (podman's graph root, docker's root folder);
        "" when it cannot say."""
        return self._info("{{.Store.GraphRoot}}", "{{.DockerRootDir}}")

    def log_driver(self) -> str:
        """The log driver a container gets by default ("" when the runtime cannot say)."""
        return self._info("{{.Host.LogDriver}}", "{{.LoggingDriver}}")

    def _info(self, podman: str, docker: str) -> str:
        """One field of the runtime's ``info`` (its template in podman's words or in
        docker's), "" when it cannot say."""
        fmt = podman if self.name == "podman" else docker
        try:
            done = self.call("info", "--format", fmt)
        except ContainerError:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    # -- containers --------------------------------------------------------------------

    def inspect(self, name: str) -> Running | None:
        """The container named ``name`` (or id), None when there is none."""
        fmt = "{{.Id}}|{{.State.Pid}}|{{.State.Status}}|{{.Image}}"
        done = self.call("container", "inspect", "--format", fmt, name)
        if done.returncode != 0:
            return None
        cid, pid, status, image_id = [*done.stdout.strip().split("|"), "", "", ""][:4]
        return Running(id=cid, pid=int(pid or 0), status=status, image_id=image_id)

    def labelled(self, marker: str) -> ContainerRef | None:
        """The container (any state) of the instance ``marker`` names, from its labels."""
        labels_fmt = "{{.Labels}}" if self.name == "docker" else "{{json .Labels}}"
        done = self.call("ps", "-a", "--no-trunc", "--filter", f"label={INSTANCE_LABEL}={marker}",
                         "--format", "{{.ID}}|" + labels_fmt)  # fmt: skip
        if done.returncode != 0:
            raise ContainerError(f"{self.name} ps: {words(done.stderr)}")
        for line in done.stdout.splitlines():
            cid, _, labels = line.partition("|")
            if cid:
                image, digest = _label(labels, IMAGE_LABEL), _label(labels, DIGEST_LABEL)
                return ContainerRef(runtime=self.name, id=cid, image=image, digest=digest)
        return None

    def exit_code(self, cid: str, since: float, wait: float = DIED_WAIT) -> Ended | None:
        """How container ``cid`` ended, asked when its `run` said no code (killed, or
        docker's daemon killed under it: the wait stream lost). Its State first: a
        container we run stays until we remove it (no `--rm`), and the runtime keeps an
        exited one's code there, also for an end while its daemon was down (which no event
        says); one gone (removed by hand, or by an older version's `run --rm`) by the
        runtime's events after ``since`` (epoch seconds, its start). Waited for up to
        ``wait`` s while it still runs or the runtime does not answer; None where nothing
        says (gone, and its end past the events the runtime keeps)."""
        deadline = time.monotonic() + wait
        while True:
            state = self.ended(cid)
            if state is not None:
                return state
            removed = self.removed(cid)  # first: a container's end is an event before that
            code = self._died(cid, since)
            if code is not None:
                return Ended(code)
            if removed or time.monotonic() > deadline:
                return None
            time.sleep(LOOK_PAUSE)

    def ended(self, cid: str) -> Ended | None:
        """Container ``cid``'s exit as its State keeps it, once it has ended (None: still
        running or starting, gone, or the runtime does not answer)."""
        done = self._look(cid, "{{.State.Status}}|{{.State.ExitCode}}|{{.State.OOMKilled}}")
        if done is None:
            return None
        status, code, oom = [*done.stdout.strip().split("|"), "", ""][:3]
        if done.returncode != 0 or status not in ENDED or not code.lstrip("-").isdigit():
            return None
        return Ended(int(code), oom_killed=oom == "true")

    def removed(self, cid: str) -> bool:
        """The runtime answers that it has no container ``cid`` (any more)."""
        done = self._look(cid, "{{.Id}}")
        return done is not None and done.returncode != 0 and gone(done.stderr)

    def _look(self, name: str, fmt: str) -> subprocess.CompletedProcess[str] | None:
        """``container inspect`` of ``name`` in ``fmt``, briefly (None: no answer)."""
        try:
            return self.call("container", "inspect", "--format", fmt, name,
                             timeout=PUBLISHER_TIMEOUT)  # fmt: skip
        except ContainerError:
            return None

    def _died(self, cid: str, since: float) -> int | None:
        """The exit code of ``cid``'s last end after ``since`` in the runtime's events."""
        kind: tuple[str, ...] = ("--stream=false", "--filter", "event=died")  # podman
        fmt = "{{.ContainerExitCode}}"
        if self.name == "docker":  # it has no --stream=false: events until now
            kind = ("--until", f"{time.time():.6f}", "--filter", "event=die")
            fmt = "{{.Actor.Attributes.exitCode}}"
        first = f"{since - SINCE_SLACK:.6f}"
        try:
            done = self.call("events", "--since", first, "--filter", f"container={cid}", *kind,
                             "--format", fmt, timeout=PUBLISHER_TIMEOUT)  # fmt: skip
        except ContainerError:
            return None
        said = done.stdout.split()
        return int(said[-1]) if done.returncode == 0 and said and said[-1].isdigit() else None

    def remove_ended(self, name: str, ours: Ours) -> bool:
        """Remove the container named ``name`` if it has ended (any state but running)
        and is ``ours``; whether nothing of ours by that name is left (False: it runs, or
        the runtime does not answer: asked again later). Another's is never touched."""
        done = self._look(name, "{{.State.Status}}|{{json .Config.Labels}}|{{json .Config.Env}}")
        if done is None:
            return False
        if done.returncode != 0:
            return gone(done.stderr)
        status, labels, env = [*done.stdout.strip().split("|", 2), "", ""][:3]
        if not ours.holds(labels, env):
            return True
        if status in ("running", "paused", "restarting", "removing", "stopping"):
            return False
        try:
            self.remove(name, 0)
        except ContainerError:
            return False
        return True

    def signal(self, name: str, sig: int) -> bool:
        """Send ``sig`` to the container's main process (what its ``stop`` sends first,
        without the wait); False when the runtime says it has no such container running."""
        done = self.call("kill", "--signal", str(sig), name)
        if done.returncode != 0 and not _not_running(done.stderr):
            raise ContainerError(f"{self.name} kill {name}: {words(done.stderr)}")
        return done.returncode == 0

    def remove(self, name: str, grace: float) -> None:
        """Stop with the grace period, then remove; a container already gone is fine."""
        self.call("stop", "-t", stop_seconds(grace), name, timeout=CALL_TIMEOUT + grace)
        if self._rm(name):
            return
        # The runtime said it had no such container, or was removing it already (docker,
        # for a `run --rm` one): wait until it is gone, LOOKS looks in a row (the "no such
        # container" may have been the runtime's mistake); one seen again is removed again.
        # A stop leaves nothing behind.
        deadline = time.monotonic() + CALL_TIMEOUT
        absent = 0
        while absent < LOOKS:
            time.sleep(LOOK_PAUSE if absent else POLL)
            if self.inspect(name) is None:
                absent += 1
                continue
            if time.monotonic() > deadline:
                raise ContainerError(f"{self.name}: container {name} is still there after rm")
            absent = 0
            if self._rm(name):
                return

    def _rm(self, name: str) -> bool:
        """Whether the runtime removed the container now: its ``rm -f`` waits for that and
        names what it removed. Not when it had none (``-f``: quietly, exit 0) or is
        removing it already."""
        done = self.call("rm", "-f", name)
        if done.returncode != 0 and not gone(done.stderr):
            raise ContainerError(f"{self.name} rm {name}: {words(done.stderr)}")
        return done.returncode == 0 and bool(done.stdout.strip())


def stop_seconds(grace: float) -> str:
    """A grace period as both CLIs take it (`stop -t`, `run --stop-timeout`): whole
    seconds, rounded up: podman's `stop -t 0` sends SIGKILL alone, so a grace under 0.5 s
    rounded to 0 gave the engine no stop signal at all."""
    return str(max(0, math.ceil(grace)))


def _pulled_by(image: str, repo_digests: str, made_with: str) -> str | None:
    """The digest of ``image``'s repository among the image's RepoDigests (None: none).

    One image may carry the digests of several repositories (tagged or pulled under more
    than one name): the one of the repository named. podman 4.3 lists the manifest the
    image was made with (``made_with``) under each of its names: built here, one no
    registry holds (a push compresses the layers: another manifest). A pull of it adds the
    registry's, which is then the one: another than ``made_with``."""
    repo = _repository(image)
    found = []
    for item in json.loads(repo_digests or "null") or []:
        name, _, digest = str(item).partition("@")
        if _repository(name) == repo or name.endswith("/" + repo):
            found.append(digest)
    pulled = [digest for digest in found if digest != made_with]
    return (pulled or found)[0] if found else None


def publisher(port: int, program: str) -> str | None:
    """The container that publishes ``port`` ("podman container web") when the process
    holding it, ``program``, is a runtime's port proxy and that runtime names it (None:
    another process, or the runtime cannot say). Asked only of a port found held."""
    runtime = PORT_PROXIES.get(os.path.basename(program))
    if runtime is None:
        return None
    try:
        names = _published_on(Runtime(runtime), port)
    except ContainerError:  # not installed, or no answer in time: the pid is said alone
        return None
    return f"{runtime} container {names[0]}" if names else None


def _published_on(runtime: Runtime, port: int) -> list[str]:
    """The names of the containers that publish TCP ``port`` on the host."""
    if runtime.name == "docker":
        args = ("ps", "--filter", f"publish={port}/tcp", "--format", "{{.Names}}")
        done = runtime.call(*args, timeout=PUBLISHER_TIMEOUT)
        return done.stdout.split() if done.returncode == 0 else []
    # podman 4.3 has no `publish` filter: each container's Ports, each a range of them
    done = runtime.call("ps", "--format", "json", timeout=PUBLISHER_TIMEOUT)
    try:
        listed = json.loads(done.stdout) if done.returncode == 0 else []
    except ValueError:
        return []
    return [name for item in listed if (name := _publishing(item, port))]


def _publishing(container: dict[str, Any], port: int) -> str:
    """podman's ``ps`` item's name if one of its published ranges holds ``port``, else ""."""
    names = container.get("Names") or [""]
    published = container.get("Ports") or []
    return str(names[0]) if any(_covers(p, port) for p in published) else ""


def _covers(published: dict[str, object], port: int) -> bool:
    first = published.get("host_port")
    count = published.get("range") or 1
    if not isinstance(first, int) or not isinstance(count, int):
        return False
    return published.get("protocol", "tcp") == "tcp" and first <= port < first + count


def _repository(image: str) -> str:
    """The repository of a reference: without its digest and tag (a port stays)."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def _label(labels: str, key: str) -> str:
    """A label's value from podman's JSON map or docker's ``k=v,k=v`` list."""
    text = labels.strip()
    if text.startswith("{"):
        value = json.loads(text).get(key, "")
        return str(value)
    for item in text.split(","):
        k, _, v = item.partition("=")
        if k == key:
            return v
    return ""


def missing_volume(volumes: Sequence[str]) -> tuple[int, str] | None:
    """The first volume (``host:container[:ro]``) whose host path this node lacks: its
    index and that path. podman refuses it, docker makes it (empty and root's): neither
    is asked (DESIGN.md "Engines in containers")."""
    for index, volume in enumerate(volumes):
        host = volume.split(":", 1)[0]
        if not os.path.exists(host):
            return index, host
    return None


def missing_folder(host: str) -> str:
    """What a volume whose host path is missing says, with the next move."""
    return (
        f"{host} does not exist on this node: create it (reconcile creates no volume's "
        "folder), or fix the path"
    )


def absent(stderr: str) -> bool:
    """The runtime says it has no such image (docker: "No such image", podman: "image not
    known"), rather than that it cannot look."""
    low = stderr.lower()
    return "no such image" in low or "image not known" in low


def gone(stderr: str) -> bool:
    """The runtime says there is no such container, or that it is removing it already."""
    low = stderr.lower()
    said = ("no such container", "no container with name or id", "already in progress")
    return any(s in low for s in said)


def _not_running(stderr: str) -> bool:
    """The runtime says the container is gone or no longer runs (podman: "can only kill
    running containers", docker: "is not running")."""
    low = stderr.lower()
    return gone(stderr) or "is not running" in low or "only kill running" in low


def words(stderr: str) -> str:
    """The runtime's own message: its last non-empty line, without the log prefix, and not
    docker's trailer after its error (``Run 'docker run --help' for more information``),
    which was all a refused `run` said."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if not TRAILER.match(line)] or lines
    if not said:
        return "failed (no message)"
    last = said[-1]
    if logged := LOGRUS.match(last):  # podman's `time="…" level=warning msg="…"`: its msg
        last = logged.group(1).replace('\\"', '"')
    for prefix in ("docker: ", "Error: ", "Error response from daemon: "):
        last = last.removeprefix(prefix)
    return last
