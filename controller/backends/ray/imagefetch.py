"""The ray backend's image edge: a container image is fetched on the node that will run
its engine before the start is placed, or before a recreate stops the engine it replaces
(``prepared``: the running one serves meanwhile, and is kept if the pull fails; on the
node it frees too, where the new one lands when the chosen node is full) (DESIGN.md
"Engines in containers", "Many nodes").

The planner places a start, and may preempt lower-priority engines for it, only once
the backend's ``fetching`` says its image is there (``Observed.fetching``): so the look
and the pull happen here, first, on one node, by a Ray task that holds no GPU (a token of
CPU, so its node affinity holds). On that node the container wrapper answers as on one
host (its ``fetching`` and ``fetch``), in the folder the engine's actor uses there
(``hostwords.node_root``): the actor's launch then reads the ended pull. The node is the one
noted for the image (``imagenodes.py``) while it fits, else the one with the most free
GPUs (a node with room before one without); the launch asks Ray for it (a soft pin).

A start the room there is cannot take is placed by preempting, and lands where its victim
ran: the planner pools the cluster's GPUs and picks the victim, so which node is known
only once it is stopped. So when the instances that may start outnumber the room, the
look and the pull are on every node with room and every node that runs an engine of
lower priority (a replica past the first, a single instance whose noted node is full):
none is preempted before the image is on the node it frees. The answer is per node: while
one of them lacks the image, as many starts as the room on the nodes that hold it takes
are placed, into that room alone (``ImageWait.room``; their launch goes there), and the
others wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controller.backends.base import Held
from controller.backends.ray import cluster, naming
from controller.backends.ray.hostwords import node_root
from controller.backends.ray.imagenodes import ImageNodes
from controller.core.imagepulls import ImageWait
from controller.core.manifest.specs import DeploymentSpec
from controller.core.render import container_image
from controller.errors import ContainerError

if TYPE_CHECKING:  # the driver never loads it: the node does (_wrapper)
    from controller.backends.local.container import Wrapper

ANSWER_TIMEOUT = 30.0  # a task on the node: a worker started there, one `image inspect`


def image_key(spec: DeploymentSpec) -> str:
    """What the note is kept by: the runtime the spec names (or none) and the image."""
    assert spec.container is not None
    return f"{spec.container.runtime or 'default'} {container_image(spec)}"


def _wrapper(state_key: str) -> Wrapper:
    """The container wrapper as the engine's actor on this node has it (its state).
    Imported here, on the node: the driver imports this module at every start (each Ray
    CLI call), and never runs a container itself (``actor.py`` says what that costs)."""
    from controller.backends.local.container import Wrapper

    return Wrapper(str(node_root(state_key).resolve()), None, static_devices=True)


def _look(state_key: str, spec: DeploymentSpec) -> str | None:
    """On the node: why a start of ``spec`` waits for its image there, else None."""
    return _wrapper(state_key).fetching(spec)


def _fetch(state_key: str, spec: DeploymentSpec) -> Held | None:
    """On the node: its pull started (or read, once ended), holding nothing."""
    try:
        return _wrapper(state_key).fetch(spec)
    except ContainerError as exc:  # the pull could not even start: a failed one, its words
        return Held(str(exc), failed=True)


def _prepared(state_key: str, spec: DeploymentSpec) -> Held | None:
    """On the node: before a running engine is stopped for ``spec``, its image's pull
    started (or read, once ended), as on one host."""
    try:
        return _wrapper(state_key).prepared(spec)
    except ContainerError as exc:  # the pull could not even start: the running one is kept
        return Held(str(exc), failed=True)


class NoAnswer(Exception):
    """The node did not answer in time: the start waits, placed nowhere."""


class ImageFetch:
    """The driver's side: which node, the task there, and the note of that node."""

    def __init__(self, state_dir: str, namespace: str) -> None:
        self.namespace = namespace  # the engines' actors' (their folder on each node)
        self.notes = ImageNodes(state_dir)
        # Image key -> the node the last look found it on (this driver's memory, so
        # `plan` writes nothing): the launch that follows the look goes there.
        self._looked: dict[str, str] = {}
        # Image key -> every node the last look asked: the fetch that follows pulls there.
        self._asked: dict[str, list[cluster.Node]] = {}
        # Image key -> the nodes the last look found without it: a replica's launch
        # goes elsewhere where it can (backend.py).
        self._lacking: dict[str, set[str]] = {}
        # Image key -> the nodes the last look found it on: the plan takes their GPUs
        # first, and the launch goes where the plan put it (backend.py).
        self._found: dict[str, set[str]] = {}

    def fetching(
        self, spec: DeploymentSpec, starting: int, below: Collection[str], ahead: int = 0
    ) -> ImageWait | None:
        """Why a start of ``spec`` waits for its image on a node that may run it: one of
        ``starting`` instances, where ``below`` are the nodes of lower-priority engines
        and ``ahead`` the GPUs the pass's starts placed before them may take; with how
        many may go meanwhile into the room of the nodes that hold it."""
        nodes = self._nodes(spec, starting, below, ahead)
        key, count = image_key(spec), spec.devices.count
        self._found[key] = found = set()  # an earlier look's is not this pass's news
        if not nodes:  # no node can take it: the placement says so
            return None
        self._looked[key] = nodes[0].node_id
        self._asked[key] = nodes
        self._lacking[key] = lacking = set()
        waits: list[str] = []
        room = 0
        for node, said in zip(nodes, self._ask_each(nodes, _look, spec), strict=True):
            if isinstance(said, NoAnswer):  # not known there: nothing is placed meanwhile
                return ImageWait(str(said))
            if said is not None:
                waits.append(f"{said} on Ray node {naming.short(node.node_id)}")
                lacking.add(node.node_id)
                continue
            found.add(node.node_id)
            if count and node.free_gpus >= count:
                room += int(node.free_gpus // count)
        return ImageWait(waits[0], room=min(room, starting)) if waits else None

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        """Start (or read) its pull on each node the last look asked (:meth:`_pulls`)."""
        nodes = self._asked.get(image_key(spec)) or self._nodes(spec, 1, ())
        found = self._pulls(nodes, _fetch, spec)
        if found is None:
            return None
        node, held = found
        return dataclasses.replace(held, why=f"{held.why} on Ray node {naming.short(node)}")

    def prepared(self, spec: DeploymentSpec, freed: str) -> Held | None:
        """Before a running engine on node ``freed`` is stopped for ``spec`` (a recreate):
        its image pulled first on the node the new one goes to (the launch asks Ray for
        it), and on ``freed`` too when that one has no room (the new one lands where the
        old one's GPUs were freed), the running one kept meanwhile; None once it is there."""
        fits = self._fits(spec)
        if not fits:  # no node can take it: the launch says so
            return None
        first = fits[0]
        self._looked[image_key(spec)] = first.node_id  # there: the launch goes there
        full = first.free_gpus < spec.devices.count
        nodes = [first, *(n for n in fits[1:] if full and n.node_id == freed)]
        found = self._pulls(nodes, _prepared, spec)
        if found is None:
            return None
        node, held = found
        return dataclasses.replace(held, why=f"{held.why} (Ray node {naming.short(node)})")

    def node_of(self, spec: DeploymentSpec) -> str | None:
        """The node pulling or holding ``spec``'s image, as noted or last looked at."""
        key = image_key(spec)
        return self.notes.node_of(key) or self._looked.get(key)

    def launch_node(self, name: str, spec: DeploymentSpec) -> str | None:
        """Where record ``name``'s launch should go for its image: the node its own last
        attempt pulls it on, else (one instance: replicas spread) the fetch's node."""
        single = spec.replicas <= 1 and spec.autoscale is None
        return self.notes.node_of(name) or (self.node_of(spec) if single else None)

    def pulling_on(self, name: str, spec: DeploymentSpec, node_id: str) -> None:
        """Record ``name``'s actor found the image missing on its node and pulls it there:
        its next attempt goes there, and the next look asks that node."""
        self.notes.note(name, node_id)
        self.notes.note(image_key(spec), node_id)

    def ran(self, name: str, spec: DeploymentSpec) -> None:
        """A container of the image runs: the notes have done their work."""
        self.notes.forget(name)
        self.notes.forget(image_key(spec))

    def _pulls(
        self, nodes: Sequence[cluster.Node], task: Any, spec: DeploymentSpec
    ) -> tuple[str, Held] | None:
        """``task``'s pull (``_fetch``, ``_prepared``) on each node at once, the first
        node noted while its pull runs or failed: a failure first, else the first wait
        (a node that does not answer keeps it), with its node; None: there on each."""
        found: list[tuple[str, Held]] = []
        for node, held in zip(nodes, self._ask_each(nodes, task, spec), strict=True):
            if isinstance(held, NoAnswer):
                found.append((node.node_id, Held(str(held))))
            elif held is not None:
                if node is nodes[0]:
                    self.notes.note(image_key(spec), node.node_id)
                found.append((node.node_id, held))
        return next((f for f in found if f[1].failed), found[0] if found else None)

    def _node(self, spec: DeploymentSpec) -> cluster.Node | None:
        """Where the start will run: the best of :meth:`_fits`."""
        return next(iter(self._fits(spec)), None)

    def _fits(self, spec: DeploymentSpec) -> list[cluster.Node]:
        """The selected nodes with GPUs enough, best first: one with room (no
        preemption), the noted one first, then the most free GPUs."""
        count = spec.devices.count
        live = cluster.selected(cluster.nodes(), spec.node_selector)
        noted = self.node_of(spec)
        return sorted(
            (n for n in live if n.gpus >= count),
            key=lambda n: (n.free_gpus < count, n.node_id != noted, -n.free_gpus, n.node_id),
        )

    def _nodes(
        self, spec: DeploymentSpec, starting: int, below: Collection[str], ahead: int = 0
    ) -> list[cluster.Node]:
        """The nodes ``starting`` instances of ``spec`` may run on: the best one, and
        when the room there is cannot take them all, every node with room and every node
        of ``below`` (the nodes of lower-priority engines), where one preempting lands.
        The room is what ``ahead`` GPUs (the pass's starts placed first) leave of it:
        counted for this deployment alone, a start whose room a higher one took preempted
        on a node never looked at."""
        fits = self._fits(spec)
        count = spec.devices.count
        taken = -(-ahead // count) if count else 0  # instances' room, rounded up
        room = sum(int(n.free_gpus // count) for n in fits) - taken if count else starting
        if not fits or room >= starting:
            return fits[:1]
        roomy = [n for n in fits if n.free_gpus >= count] or fits[:1]  # best first
        return [*roomy, *(n for n in fits if n.node_id in below and n not in roomy)]

    def lacking(self, spec: DeploymentSpec) -> set[str]:
        """The nodes the last look found without ``spec``'s image."""
        return self._lacking.get(image_key(spec), set())

    def holding(self, spec: DeploymentSpec) -> set[str]:
        """The nodes the last look found ``spec``'s image on."""
        return self._found.get(image_key(spec), set())

    def _ask_each(
        self, nodes: Sequence[cluster.Node], task: Any, spec: DeploymentSpec
    ) -> list[Any]:
        """``task``'s answer on each node, asked at once; NoAnswer for a node that did not
        answer in time (busy or lost)."""
        pinned = [NodeAffinitySchedulingStrategy(node_id=n.node_id, soft=False) for n in nodes]
        refs = [
            ray.remote(task)
            .options(num_cpus=cluster.TOKEN_CPU, num_gpus=0, scheduling_strategy=pin)
            .remote(self.namespace, spec)
            for pin in pinned
        ]
        deadline = time.monotonic() + ANSWER_TIMEOUT
        return [self._answer(n, ref, spec, deadline) for n, ref in zip(nodes, refs, strict=True)]

    def _answer(self, node: cluster.Node, ref: Any, spec: DeploymentSpec, deadline: float) -> Any:
        """One task's answer by ``deadline`` (the looks' together), else NoAnswer (returned,
        not raised: the other nodes' answers are read all the same)."""
        try:
            return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except RayError as exc:
            with contextlib.suppress(RayError, ValueError):
                ray.cancel(ref, force=True)
            return NoAnswer(
                f"Ray node {naming.short(node.node_id)} did not say whether image "
                f"{container_image(spec)} is there ({type(exc).__name__}): asked again "
                "at the next pass; nothing is placed meanwhile"
            )
