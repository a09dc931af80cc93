"""The ray :class:`~controller.backends.base.Backend`: a Deployment is one detached actor.

Ray places the actor (``num_gpus = devices.count``), restarts it when its node is lost
(``max_restarts=-1``) and kills it on ``ray.kill``; the actor (``actor.EngineHost``)
runs the engine on its node. The record stays in our state dir: this class answers for
it through the actor, in one batched round of calls per observation (``refresh``).
A ``spec.source`` is pulled on a node first (``pulls.RayPuller``, the pass's puller);
the launch pins the actor to a node that holds the file. ``spec.nodeSelector`` is matched
against the Ray nodes' labels (``ray start --labels``): the actor carries it as Ray's
``label_selector`` (a beta API of Ray, hence the version cap in pyproject.toml), and
every node this class picks itself (a replica's, a pull's) is one that matches.

An actor's methods are called with keywords: Ray keeps an actor's class with its methods
by name, and a driver that cannot load it (an older reconcile's actor, whose
``EngineHost`` had the methods ``nodeengine.NodeEngine`` has now) is handed methods that
take keywords only; a positional call was a TypeError, and its engine not read or stopped.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controller.backends.base import ExitStatus, Held, StartRequest
from controller.backends.ray import cluster, naming
from controller.backends.ray.actor import EngineHost, EngineJob, HostStatus
from controller.backends.ray.hostwords import MISSING_MODEL, PULLING_IMAGE
from controller.backends.ray.imagefetch import ImageFetch
from controller.backends.ray.onnodes import OnTheirNodes
from controller.backends.ray.pulls import RayPuller
from controller.core.devices.inventory import Inventory
from controller.core.imagepulls import FAILED, ImageWait
from controller.core.manifest.names import base_name
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.state import ContainerRef, Instance, MarkedProcess, ProcessRef, Record
from controller.errors import (
    ContainerError,
    ImagePullFailed,
    PullingFirst,
    SpawnError,
    Unplaceable,
)
from controller.logsetup import get_logger

log = get_logger("reconcile")

STATUS_TIMEOUT = 2.0  # one round of status calls: an actor slower than this is restarting
PLACE_TIMEOUT = 60.0  # a new actor placed and its engine spawned (worker start, imports)
GONE_TIMEOUT = 15.0  # a killed actor leaves the name registry
STOP_TIMEOUT = 30.0  # an actor kills its engine (a container: the runtime's stop and rm)
NO_REF = ProcessRef(pid=1, start_time=0.0)  # an actor whose engine we have not seen (yet)


@dataclass(frozen=True, slots=True)
class SeenActor:
    """One actor as the last refresh found it."""

    namespace: str
    actor: str
    name: str
    nonce: str
    status: HostStatus | None  # None: it did not answer in time (Ray is restarting it)
    dead: bool = False


class RayBackend(OnTheirNodes):
    def __init__(self, address: str, state_dir: str, owner: str) -> None:
        cluster.connect(address)
        self.state_dir = state_dir
        self.owner = owner
        self.namespace = naming.namespace(state_dir, owner)
        self._seen: dict[tuple[str, str], SeenActor] = {}  # (namespace, nonce) -> actor
        self._handles: dict[tuple[str, str], Any] = {}  # (namespace, actor name) -> handle
        self._ns_of: set[str] = {self.namespace}
        self._by_ref: dict[tuple[int, float], SeenActor] = {}
        # Record name -> the node its actor runs on (the last refresh, then each launch):
        # a replica's launch avoids its siblings' nodes.
        self._nodes: dict[str, str] = {}
        # (node, priority) of each record holding GPUs (the last refresh): where a start
        # of higher priority may land by preempting it (imagefetch.py looks there).
        self._holding: list[tuple[str, int]] = []
        self._placing = threading.Lock()  # one pass launches replicas concurrently
        self._puller: RayPuller | None = None  # made by puller(): the pass's model pulls
        self._images = ImageFetch(state_dir, self.namespace)  # pulled before placing

    def puller(self, state_dir: Path, stall_seconds: float) -> RayPuller:
        """Pulls on the node that will run the engine, into that node's model cache."""
        self._puller = RayPuller(self.namespace, state_dir, stall_seconds)
        return self._puller

    # -- placement -----------------------------------------------------------------------

    def devices(self) -> Inventory | None:
        """The live nodes' GPUs, read at every pass: nodes join and leave a cluster."""
        return cluster.inventory()

    def unplaceable(self, spec: DeploymentSpec) -> str | None:
        return cluster.unfit(spec.devices.count, spec.node_selector)

    def fetching(self, spec: DeploymentSpec, starting: int = 1, ahead: int = 0) -> ImageWait | None:
        """Why a start waits for its image on a node it may run on (imagefetch.py): it
        is placed, and preempts, only once the image is there."""
        if spec.container is None:
            return None
        below = {node for node, priority in self._holding if priority < spec.priority}
        return self._images.fetching(spec, starting, below, ahead)

    def image_nodes(self, spec: DeploymentSpec) -> frozenset[str]:
        if spec.container is None:
            return frozenset()
        return frozenset(naming.short(n) for n in self._images.holding(spec))

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        """The image's pull on that node, holding no GPU (imagefetch.py)."""
        return None if spec.container is None else self._images.fetch(spec)

    def prepared(self, spec: DeploymentSpec, running: Record) -> Held | None:
        """Before a recreate stops the running engine: the new image pulled first on the
        node the new one goes to (imagefetch.py), the running one serving meanwhile."""
        return None if spec.container is None else self._images.prepared(spec, running.node)

    # -- launch ------------------------------------------------------------------------

    def launch(self, launch: StartRequest) -> Instance:
        rec, spec = launch.record, launch.entry.deployment.spec
        assert rec.nonce is not None and rec.port is not None
        short = cluster.unfit(spec.devices.count, spec.node_selector)
        if short is not None:
            raise Unplaceable(short)
        ns = naming.namespace(self.state_dir, rec.owner)
        model = self._model_node(rec, launch.entry)
        strategy = model[1] if model is not None else self._image_node(rec, spec)
        strategy = strategy or self._planned(rec, spec) or self._strategy(rec.name, spec)
        job = EngineJob(
            entry=launch.entry,
            nonce=rec.nonce,
            state_key=ns,
            base_port=rec.port,
            record=rec.name,
            model_path=model[0] if model is not None else None,
        )
        handle: Any = (
            ray.remote(EngineHost)
            .options(
                name=naming.actor_name(rec.name, rec.nonce),
                namespace=ns,
                lifetime="detached",  # engines outlive a cron pass, as local ones do
                num_gpus=spec.devices.count,
                # The engine's CPU use is not Ray's to ration; a replica asking for no
                # GPU asks for a token of CPU so its node affinity (or labels) hold
                # (cluster.py).
                num_cpus=cluster.TOKEN_CPU
                if spec.devices.count == 0 and (strategy != "DEFAULT" or spec.node_selector)
                else 0,
                # Ray's own filter: no node without these labels, whatever the strategy.
                label_selector=dict(spec.node_selector) or None,
                max_restarts=-1,  # a lost node: Ray brings it back where there is room
                max_concurrency=4,  # status and logs answer while a stop waits
                scheduling_strategy=strategy,
            )
            .remote(job)
        )
        self._handles[(ns, naming.actor_name(rec.name, rec.nonce))] = handle
        try:
            status: HostStatus = ray.get(handle.status.remote(), timeout=PLACE_TIMEOUT)
        except (GetTimeoutError, RayActorError) as exc:
            self._kill(handle)
            why = cluster.unfit(spec.devices.count, spec.node_selector)
            if why is not None:
                raise Unplaceable(why) from exc
            raise SpawnError(f"Ray did not start the actor in {PLACE_TIMEOUT:g}s: {exc}") from exc
        if status.ref is None:  # the engine could not be exec'd there: say why, stop
            self._kill(handle)
            source = spec.source
            if source is not None and self._puller and status.message.startswith(MISSING_MODEL):
                self._puller.forget(source.key, status.node_id)  # the next pass pulls again
            if status.message.startswith(PULLING_IMAGE):  # the image's pull goes on there
                self._images.pulling_on(rec.name, spec, status.node_id)
                raise PullingFirst(f"{status.message} on Ray node {naming.short(status.node_id)}")
            if status.message.startswith(FAILED):  # its pull ended without it: nothing ran
                where = f" on Ray node {naming.short(status.node_id)}"
                raise ImagePullFailed(status.message + where)  # backs off holding nothing
            if spec.container is not None:  # the runtime's words, with its own next move
                raise ContainerError(status.message)  # (not "correct spec.command[0]")
            raise SpawnError(status.message)
        if spec.container is not None:
            self._images.ran(rec.name, spec)
        with self._placing:
            self._nodes[rec.name] = status.node_id
        return _instance(status)

    def _model_node(self, rec: Record, entry: Entry) -> tuple[str, Any] | None:
        """Where ``entry``'s pulled files are: (their path there, a hard pin to that node).

        The files are on the nodes that pulled them, so the actor must go to one of them
        (soft affinity is not enough): the plan's node (``_planned_node``: the plan puts
        it on one that holds them, ``PullView.nodes``, where one fits), else, of those with
        room, the one with the fewest of its siblings. None: no source. No holder with
        room, or a plan that chose a node without them (one a selector-bound deployment
        needs is left to it): a pull to a node that has room (the plan's) starts (or goes
        on), and the start waits (Pulling)."""
        source = entry.deployment.spec.source
        if source is None or self._puller is None:
            return None
        spec, name = entry.deployment.spec, rec.name
        count = spec.devices.count
        holders = self._puller.holders(source.key)
        if not holders:
            raise Unplaceable(f"the model files of {name} are on no live Ray node: pulled again")
        planned = self._planned_node(rec, spec)
        with self._placing:
            taken = self._siblings(name)
            live = cluster.selected(cluster.nodes(), spec.node_selector)
            fits = [n for n in live if n.node_id in holders and n.free_gpus >= count]
            if fits and (planned is None or planned in holders):
                node = min(
                    fits,
                    key=lambda n: (n.node_id != planned, taken[n.node_id], -n.free_gpus, n.node_id),
                )
                self._nodes[name] = node.node_id
                pin = NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
                return holders[node.node_id], pin
            # Under the lock: two replicas' launches start one pull, not one each.
            why = "not on the node plan put it on" if fits else "which has no room for it"
            self._pull_elsewhere(entry, live, holders, count, planned, why)

    def _pull_elsewhere(
        self,
        entry: Entry,
        live: list[cluster.Node],
        holders: dict[str, str],
        count: int,
        planned: str | None,
        why: str,
    ) -> NoReturn:
        """No node holding the files has room, or the plan chose one without them
        (``why``): pull them to one with room for ``count`` GPUs, once: the one pulling
        them, else the plan's."""
        assert self._puller is not None and entry.deployment.spec.source is not None
        spec = entry.deployment.spec
        on = ", ".join(naming.short(n) for n in sorted(holders))
        room = [n for n in live if n.free_gpus >= count]  # live: the selected nodes
        if not room:
            why = cluster.unfit(count, spec.node_selector) or "no Ray node has room for it"
            raise Unplaceable(f"{why} (its model files are on node {on})")
        key = entry.deployment.spec.source.key
        pulling = self._puller.pulling_on(key)
        node = next((n for n in room if n.node_id == pulling), None)
        if node is None:  # the plan's node, else the roomiest
            node = min(room, key=lambda n: (n.node_id != planned, -n.free_gpus, n.node_id))
            self._puller.start_on(entry, (entry.name,), node)
        raise PullingFirst(
            f"its model files are on node {on}, {why}: pulling them to "
            f"node {naming.short(node.node_id)}"
        )

    def _image_node(self, rec: Record, spec: DeploymentSpec) -> Any:
        """The node pulling or holding this record's image (imagefetch.py), while it is
        live and selected: a soft pin (full or lost, the engine goes elsewhere), for a
        start the plan put on no node. None: no note, or a plan's node, where ``_planned``
        sends it: the plan takes the nodes the look found the image on first
        (``image_nodes``), and one it chose past them it chose for a reason (a node a
        selector-bound deployment needs, taken by a start before it), so the image is
        looked for there, by the actor (missing: pulled there, holding nothing). The look
        asks one node when every start fits there; sent to the noted node instead, the
        engine ran where `plan` did not say, on a node another deployment needed."""
        if spec.container is None:
            return None
        name, planned = rec.name, self._planned_node(rec, spec)
        if planned is not None:
            return None
        node = self._images.launch_node(name, spec)
        live = cluster.selected(cluster.nodes(), spec.node_selector) if node else []
        if node is None or not any(n.node_id == node for n in live):
            return None
        with self._placing:
            self._nodes[name] = node  # claimed now: a concurrent sibling's launch sees it
        return _soft_pin(node)

    def _siblings(self, name: str) -> Counter[str]:
        """Node id -> how many other instances of ``name``'s deployment it runs (call
        under ``_placing``)."""
        deployment = base_name(name)
        return Counter(
            node
            for other, node in self._nodes.items()
            if base_name(other) == deployment and other != name
        )

    def _planned(self, rec: Record, spec: DeploymentSpec) -> Any:
        """The node of the GPUs the plan chose for ``rec``: a soft pin, so the pass runs
        it where `plan` said. The planner spreads replicas over nodes, and leaves a node
        that a selector-bound deployment needs for last; a choice of the launch's own
        (``_strategy``) could take that node and leave the other Pending. None: no GPUs,
        or no such node."""
        node = self._planned_node(rec, spec)
        if node is None:
            return None
        with self._placing:
            self._nodes[rec.name] = node  # claimed now: a concurrent sibling's launch sees it
        return _soft_pin(node)

    def _planned_node(self, rec: Record, spec: DeploymentSpec) -> str | None:
        """The node of the GPUs the plan chose for ``rec`` (their keys name it), while it
        is live and selected; None: no GPUs, or no such node."""
        planned = {naming.node_of(key) for key in rec.devices}
        live = cluster.selected(cluster.nodes(), spec.node_selector) if planned else []
        nodes = [n.node_id for n in live if naming.short(n.node_id) in planned]
        return nodes[0] if len(nodes) == 1 else None

    def _strategy(self, name: str, spec: DeploymentSpec) -> Any:
        """Where Ray should put the actor of record ``name``.

        A replica asking for no GPU (one that does goes where the plan put its GPUs:
        ``_planned``) goes to a node none of its siblings is on, where one has room: Ray's
        SPREAD alone is per driver, and every pass is a new one, so three replicas
        launched by two passes landed on two nodes. Not to one the pass's look found
        without its image (imagefetch.py) while another has room. ``soft``: if that node
        cannot take it after all, Ray places it anywhere. One replica: Ray's default
        packing."""
        if spec.replicas <= 1 and spec.autoscale is None:
            return "DEFAULT"
        lacking = self._images.lacking(spec) if spec.container is not None else set()
        with self._placing:
            taken = self._siblings(name)
            live = cluster.selected(cluster.nodes(), spec.node_selector)
            fits = [n for n in live if n.free_gpus >= spec.devices.count]
            if not fits:
                return "SPREAD"
            node = min(
                fits,
                key=lambda n: (n.node_id in lacking, taken[n.node_id], -n.free_gpus, n.node_id),
            ).node_id
            self._nodes[name] = node  # claimed now: a concurrent sibling's launch sees it
        return _soft_pin(node)

    # -- observing: one batched round -----------------------------------------------------

    def refresh(self, records: Iterable[Record]) -> None:
        """List our actors and ask each for its status, all at once (one ``ray.wait``)."""
        records = list(records)
        self._holding = [
            (r.node, r.priority) for r in records if r.backend == self.name and r.devices
        ]
        self._ns_of = {self.namespace} | {
            naming.namespace(self.state_dir, r.owner) for r in records if r.backend == self.name
        }
        listed = [
            (a["namespace"], a["name"])
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] in self._ns_of
        ]
        calls: dict[Any, tuple[str, str]] = {}
        for ns, actor in listed:
            handle = self._handle(ns, actor)
            if handle is not None:
                calls[handle.status.remote()] = (ns, actor)
        ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=STATUS_TIMEOUT)
        answers = {calls[ref]: ref for ref in ready}
        seen: dict[tuple[str, str], SeenActor] = {}
        for ns, actor in listed:
            parsed = naming.parse(actor)
            if parsed is None:
                continue
            status, dead = None, False
            if (ns, actor) in answers:
                try:
                    status = ray.get(answers[(ns, actor)])
                except ActorDiedError:
                    dead = True
                except RayActorError:
                    pass  # unavailable for now: being restarted
            seen[(ns, parsed[1])] = SeenActor(ns, actor, parsed[0], parsed[1], status, dead)
        self._seen = seen
        with self._placing:
            self._nodes = {
                s.name: s.status.node_id for s in seen.values() if s.status and not s.dead
            }
        self._by_ref = {  # the records' refs: how alive() and exit_of() find their actor
            _key(r.ref): self._seen[k]
            for r in records
            if r.backend == self.name and r.ref is not None and r.nonce is not None
            for k in [(naming.namespace(self.state_dir, r.owner), r.nonce)]
            if k in self._seen
        }

    def _handle(self, ns: str, actor: str) -> Any:
        key = (ns, actor)
        if key not in self._handles:
            try:
                self._handles[key] = ray.get_actor(actor, namespace=ns)
            except ValueError:
                return None  # gone between the listing and now
        return self._handles[key]

    def _of(self, rec: Record) -> SeenActor | None:
        if rec.nonce is None:
            return None
        return self._seen.get((naming.namespace(self.state_dir, rec.owner), rec.nonce))

    def container_of(self, rec: Record) -> ContainerRef | None:
        return None  # the actor reports its container with where it runs (instance_of)

    def instance_of(self, rec: Record) -> Instance | None:
        seen = self._of(rec)
        if seen is None or seen.dead:
            return None
        if seen.status is None:
            why = cluster.unfit(rec.device_count)
            message = "Ray is restarting its actor (node lost?)"
            return Instance(
                ref=None,
                node=rec.node,
                host=rec.host,
                port=rec.port,
                devices=rec.devices,
                message=f"{message}: {why}" if why else message,
            )
        if seen.status.ended is not None:
            return None
        return _instance(seen.status)

    def alive(self, ref: ProcessRef | None) -> bool:
        """The record's instance lives: its actor is up (or being restarted by Ray)."""
        seen = self._by_ref.get(_key(ref)) if ref is not None else None
        if seen is None or seen.dead:
            return False
        return seen.status is None or seen.status.ended is None

    def exit_of(self, ref: ProcessRef) -> ExitStatus | None:
        """How the engine ended when its policy said not to restart it (the actor knows)."""
        seen = self._by_ref.get(_key(ref))
        if seen is None or seen.status is None or seen.status.ended is None:
            return None
        return ExitStatus(*seen.status.ended)

    def strangers(self) -> list[MarkedProcess]:
        return []  # actors are found by the namespace, not the state dir's path

    def scan(self) -> list[MarkedProcess]:
        """Our actors as marked processes: the planner adopts or reaps them by nonce."""
        out = []
        for seen in self._seen.values():
            if seen.dead:  # `refresh` lists only our namespaces
                continue
            ref = seen.status.ref if seen.status and seen.status.ref else NO_REF
            out.append(MarkedProcess(ref=ref, name=seen.name, nonce=seen.nonce, ppid=0))
        return out

    # -- stopping -------------------------------------------------------------------------

    def teardown(self, rec: Record) -> None:
        """The engine stopped by its actor (signal, grace, SIGKILL), then the actor killed."""
        found = self._actor_of(rec)
        handle = self._handle(*found) if found is not None else None
        if found is None or handle is None:
            return
        ns, actor = found
        try:
            ray.get(
                handle.stop.remote(sig=rec.stop_signal, grace=rec.grace_seconds),
                timeout=rec.grace_seconds + 10,
            )
        except (GetTimeoutError, RayActorError) as exc:
            log.warning("actor did not stop its engine", deployment=rec.name, error=str(exc))
        self._kill(handle, ns, actor)

    def _actor_of(self, rec: Record) -> tuple[str, str] | None:
        """(namespace, name) of the record's actor: the one of its nonce. A rolling
        update's new instance keeps the name its launch gave it (``web@next.<nonce>``)
        once the record is ``web``: found by the launch's name, `down` left it running."""
        if rec.nonce is None:
            return None
        seen = self._of(rec)
        if seen is not None:
            return seen.namespace, seen.actor
        ns = naming.namespace(self.state_dir, rec.owner)
        for a in ray.util.list_named_actors(all_namespaces=True):  # no look this run yet
            parsed = naming.parse(a["name"])
            if a["namespace"] == ns and parsed is not None and parsed[1] == rec.nonce:
                return ns, str(a["name"])
        return None

    def sweep(self, nonce: str | None, ref: ProcessRef | None = None) -> int:
        """Kill the actor(s) of ``nonce`` in our namespaces (its engine dies with it)."""
        if nonce is None:
            return 0
        killed = 0
        for a in ray.util.list_named_actors(all_namespaces=True):
            ns, actor = a["namespace"], a["name"]
            parsed = naming.parse(actor)
            if ns in self._ns_of and parsed is not None and parsed[1] == nonce:
                handle = self._handle(ns, actor)
                if handle is not None:
                    self._stop_engine(handle, actor)
                    self._kill(handle, ns, actor)
                    killed += 1
        return killed

    def _stop_engine(self, handle: Any, actor: str) -> None:
        """Ask the actor to kill its engine now: a container's main process is the
        runtime's child, not the actor's, so it would outlive ``ray.kill``."""
        try:
            ray.get(handle.stop.remote(sig=signal.SIGKILL, grace=0.0), timeout=STOP_TIMEOUT)
        except (GetTimeoutError, RayActorError) as exc:
            log.warning("actor did not stop its engine", actor=actor, error=str(exc))

    def kill(self, ref: ProcessRef) -> None:
        for seen in self._seen.values():
            if seen.status is not None and _same(seen.status.ref, ref):
                self.sweep(seen.nonce)

    def _kill(self, handle: Any, ns: str | None = None, actor: str | None = None) -> None:
        held = self._held(ns, actor)
        before = cluster.free_gpus(held[0]) if held else None
        ray.kill(handle, no_restart=True)
        if ns is None or actor is None:
            return
        self._handles.pop((ns, actor), None)
        deadline = time.monotonic() + GONE_TIMEOUT
        while time.monotonic() < deadline:  # the name is free once it is gone
            try:
                ray.get_actor(actor, namespace=ns)
            except ValueError:
                break
            time.sleep(0.05)
        # ... and its GPUs a moment later: a pass placing right after must see them free.
        while held and before is not None and time.monotonic() < deadline:
            now = cluster.free_gpus(held[0])
            if now is None or now >= before + held[1]:
                return
            time.sleep(0.05)

    def _held(self, ns: str | None, actor: str | None) -> tuple[str, int] | None:
        """(node, GPUs) the actor held when last seen; None if it held none or is unknown."""
        for seen in self._seen.values():
            if (seen.namespace, seen.actor) == (ns, actor) and seen.status and seen.status.devices:
                return seen.status.node_id, len(seen.status.devices)
        return None

    # -- where engines run ----------------------------------------------------------------

    def listening_ports(self) -> frozenset[int]:
        return frozenset()  # each actor probes its own node's ports

    def port_bindable(self, port: int) -> bool:
        return True  # the actor binds on its node; the planner's port is where it starts

    def log_tail(self, name: str, count: int) -> list[str]:
        for seen in self._seen.values():
            if seen.name == name and not seen.dead:
                handle = self._handle(seen.namespace, seen.actor)
                if handle is None:  # gone since the last refresh (its node was lost)
                    return []
                try:
                    lines: list[str] = ray.get(handle.log_tail.remote(count=count), timeout=5)
                    return lines
                except (GetTimeoutError, RayActorError):
                    return []
        return []

    def log_since(self, rec: Record, offset: int) -> tuple[bytes, int] | None:
        """The engine's log from ``offset`` (``reconcile logs``), read through its actor."""
        found = self._actor_of(rec)
        handle = self._handle(*found) if found is not None else None
        if handle is None:
            return None
        try:
            chunk: tuple[bytes, int] = ray.get(handle.log_since.remote(offset=offset), timeout=10)
        except (GetTimeoutError, RayActorError):
            return None
        return chunk


def _soft_pin(node: str) -> NodeAffinitySchedulingStrategy:
    """Ray asked for ``node``, and elsewhere when that node is lost or full. ``soft`` alone
    goes elsewhere only when the node is lost or could never fit: a node that is full now
    (another launch of the pass took its GPU, or the image's node while the engine it
    replaces holds it) kept the actor waiting there until PLACE_TIMEOUT failed the start."""
    return NodeAffinitySchedulingStrategy(node_id=node, soft=True, _spill_on_unavailable=True)


def _instance(status: HostStatus) -> Instance:
    return Instance(
        ref=status.ref,
        node=status.node_id,
        host=status.host,
        port=status.port,
        devices=status.devices,
        message=status.message,
        container=status.container,
    )


def _key(ref: ProcessRef) -> tuple[int, float]:
    return ref.pid, ref.start_time


def _same(a: ProcessRef | None, b: ProcessRef) -> bool:
    return a is not None and a.same_process(b)
