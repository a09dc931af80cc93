"""The ray backend's pull edge: a model is pulled on the node that will run the engine.

:meth:`RayPuller.start` places a :class:`~controller.backends.ray.pullactor.ModelPull`
actor on the node the engine will most likely go to (the most free GPUs among those
that fit it; the node of an earlier, broken attempt first, so its ``.partial`` file is
resumed). :meth:`RayPuller.observe` asks every pull actor of our namespace how it goes,
in one round, and turns the answers into the planner's :class:`PullView` s: cached (on
a live node that holds it), pulling (with the node's progress), failed, or absent.

This host's cache entry keeps the note of where copies are (``nodes.json``: node ->
path), the node's last progress figure (what ``status``, ``describe`` and ``--wait``
read) and ``used.json``; a done actor is ended once its copy is noted. The launch then
pins the engine's actor to a node in the note (:meth:`RayPuller.holders`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controller.backends.ray import cluster
from controller.backends.ray.naming import short
from controller.backends.ray.pullactor import ModelPull, PullAnswer
from controller.core.manifest.specs import Entry
from controller.core.pulls import PullFailure, PullView
from controller.logsetup import get_logger
from controller.pull.job import Job
from controller.store.instances.events import Journal
from controller.store.models import modelcache
from controller.store.models.modelcache import CacheEntry, utcnow

log = get_logger("reconcile")

SUFFIX = "-pulls"  # the pull actors' namespace: the engine actors' one, apart
LOOK_TIMEOUT = 2.0  # one round of look calls: an actor slower than this is restarting
# The hub's endpoint and token as this host has them (where the user set them), for the
# node's pull; unset here, the node's own apply.
HUB_ENV = ("HF_ENDPOINT", "HF_TOKEN")


class RayPuller:
    def __init__(self, namespace: str, state_dir: Path, stall_seconds: float) -> None:
        self.namespace = namespace + SUFFIX
        self.cache = modelcache.cache_root(state_dir)
        self.state_dir = state_dir
        self.stall_seconds = stall_seconds
        self.journal = Journal(state_dir)
        # The last observe's answers (key -> actor, answer), for settle.
        self._answers: dict[str, tuple[Any, PullAnswer]] = {}

    # -- the planner's view ---------------------------------------------------------------

    def observe(self) -> dict[str, PullView]:
        """A pure read (``reconcile plan`` writes nothing): the actors' answers are kept
        for :meth:`settle`, which the pass calls on its act side."""
        live = {n.node_id for n in cluster.nodes()}
        answers, silent = self._ask()
        self._answers = answers
        views: dict[str, PullView] = {}
        for key, (_, answer) in answers.items():
            if answer.path is not None:
                if answer.node_id in live:  # done: the note will say so (settle)
                    done = {answer.node_id, *_held(CacheEntry.of(self.cache, key), live)}
                    views[key] = PullView(key=key, cached=True, nodes=_short(done))
                continue
            views[key] = self._counted(CacheEntry.of(self.cache, key).nodes(), answer.view)
        for entry in modelcache.entries(self.cache):
            key = entry.key
            if key in views:
                continue
            note = entry.nodes()
            if held := _held(entry, live):  # the plan puts its engines there first
                views[key] = PullView(key=key, cached=True, nodes=_short(held))
            elif key in silent:  # Ray is restarting its actor (killed, its node busy)
                seen = PullView(key=key, running=True, progress=entry.progress())
                views[key] = self._counted(note, seen)
            elif note.get("pulling") or note.get("failure"):  # gone: resumed; failed: ended
                views[key] = self._counted(note, PullView(key=key, progress=entry.progress()))
        return views

    def settle(self) -> None:
        """The act side of :meth:`observe`: a done pull's copy is noted and its actor
        ended; a failure is journalled (and counted); the node's progress kept here."""
        answers, self._answers = self._answers, {}
        for key, (actor, answer) in answers.items():
            entry = CacheEntry.of(self.cache, key)
            if answer.path is not None:
                self._noted(entry, answer)
                ray.kill(actor, no_restart=True)  # its copy is noted: the actor's work is done
                continue
            if answer.view.progress is not None:  # for status, describe and --wait's bar
                entry.ensure()
                entry.write_progress(answer.view.progress)
            if self._failed(entry, answer):
                ray.kill(actor, no_restart=True)  # its failure is noted: the retry's is new

    def _counted(self, note: dict[str, Any], view: PullView) -> PullView:
        """The view with the failures in a row as this host counts them (the note keeps
        the last one, as a local pull's ``result.json`` does): an ended failed actor's
        failure stays the key's until a retry's own outcome replaces it, and a retry's
        actor that knows of none before (another node's cache) goes on from the count."""
        kept = note.get("failure")
        noted = PullFailure.from_json(kept) if isinstance(kept, dict) else None
        failure = view.failure
        if view.cached or noted is None:
            return view
        if failure is None or failure.at < noted.at:  # a retry under way, the actor ended
            return dataclasses.replace(view, failure=noted)
        if failure.at == noted.at:
            attempts = max(failure.attempts, noted.attempts)
        elif failure.attempts > noted.attempts:  # counted on its node, from its last result
            return view
        else:  # a failure not counted yet: the one after those noted
            attempts = noted.attempts + 1
        if attempts == failure.attempts:
            return view
        return dataclasses.replace(view, failure=dataclasses.replace(failure, attempts=attempts))

    def _ask(self) -> tuple[dict[str, tuple[Any, PullAnswer]], set[str]]:
        """Each key's pull actor and its answer; the keys whose actor did not answer."""
        actors: dict[str, Any] = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a["namespace"] == self.namespace and modelcache.KEY.match(_key(a["name"])):
                with contextlib.suppress(ValueError):  # gone between the listing and now
                    actors[a["name"]] = ray.get_actor(a["name"], namespace=self.namespace)
        calls: dict[Any, tuple[str, Any]] = {
            handle.look.remote(): (name, handle) for name, handle in actors.items()
        }
        ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=LOOK_TIMEOUT)
        answers: dict[str, tuple[Any, PullAnswer]] = {}
        silent = {_key(name) for name in actors}
        for ref in ready:
            name, handle = calls[ref]
            try:
                answer: PullAnswer = ray.get(ref)
            except ActorDiedError:
                silent.discard(_key(name))
                continue
            except RayActorError:
                continue  # being restarted
            answers[_key(name)] = (handle, answer)
            silent.discard(_key(name))
        return answers, silent

    def _noted(self, entry: CacheEntry, answer: PullAnswer) -> None:
        note = entry.nodes()
        held: dict[str, Any] = note.get("held") or {}
        first = answer.node_id not in held
        held[answer.node_id] = {
            "path": answer.path,
            "host": answer.host,
            "sha256": answer.sha256,
            "bytes": answer.bytes,
            "at": utcnow().isoformat(),
        }
        entry.write_nodes({**note, "held": held, "pulling": None, "failure": None})
        if first:
            for name in answer.deployments:
                self.journal.append(
                    name, "pull", f"on node {answer.node_id[:12]}", "done", sha256=answer.sha256
                )

    def _failed(self, entry: CacheEntry, answer: PullAnswer) -> bool:
        """Note a failed pull (its failure and the count in a row) and journal it (each
        attempt's once); True: it failed and is noted, its actor may end."""
        if answer.view.running or answer.view.failure is None:
            return False
        note = entry.nodes()
        failure = self._counted(note, answer.view).failure
        assert failure is not None
        kept = note.get("failure")
        if isinstance(kept, dict) and kept.get("at") == failure.at.isoformat():
            return True
        entry.ensure()
        entry.write_nodes({**note, "failure": failure.as_json()})
        for name in answer.deployments:
            self.journal.append(
                name,
                "pull",
                f"on node {answer.node_id[:12]}",
                "failed",
                error=failure.message,
                attempts=failure.attempts,
            )
        return True

    # -- starting a pull --------------------------------------------------------------------

    def start(self, entry: Entry, waiting: tuple[str, ...]) -> str:
        spec = entry.deployment.spec
        assert spec.source is not None
        node = self._node_for(spec.source.key, spec.devices.count, spec.node_selector)
        return self.start_on(entry, waiting, node)

    def start_on(self, entry: Entry, waiting: tuple[str, ...], node: cluster.Node) -> str:
        """A pull actor on ``node`` (one before it for the key, a failed one, is ended)."""
        source = entry.deployment.spec.source
        assert source is not None
        self._end(source.key)
        job = Job(
            source=source,
            cache=self.cache,  # the actor puts its node's own cache here
            state_dir=self.state_dir,
            deployments=waiting or (entry.name,),
            stall_seconds=self.stall_seconds,
        )
        ray.remote(ModelPull).options(
            name=f"{source.key}.{uuid.uuid4().hex[:8]}",
            namespace=self.namespace,
            lifetime="detached",  # outlives the pass, as a local pull process does
            num_gpus=0,
            num_cpus=cluster.TOKEN_CPU,
            max_restarts=-1,  # a killed actor comes back on its node and resumes
            # Hard: the .partial file of a resumed pull is on that node alone.
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
            runtime_env=_hub_env(),
        ).remote(job, self.namespace.removesuffix(SUFFIX))
        target = CacheEntry.of(self.cache, source.key)
        target.write_nodes({**target.nodes(), "pulling": node.node_id})
        return f"on node {node.node_id[:12]} ({node.address})"

    def pulling_on(self, key: str) -> str | None:
        """The node the key's pull was last started on (None: no pull under way)."""
        note = CacheEntry.of(self.cache, key).nodes()
        node = note.get("pulling")
        return node if isinstance(node, str) else None

    def _node_for(self, key: str, count: int, selector: Mapping[str, str]) -> cluster.Node:
        """Where the engine will most likely go: the earlier attempt's node if it still
        fits (its partial file is there), else the most free GPUs of the nodes that fit,
        of those its ``nodeSelector`` chooses (while none does, any: the start stays
        Pending saying so, and the files are where a relabelled node may run it)."""
        live = cluster.nodes()
        live = cluster.selected(live, selector) or live
        fits = [n for n in live if n.free_gpus >= count] or live
        if not fits:
            raise RuntimeError("the Ray cluster has no live node")
        earlier = self.pulling_on(key)
        for n in fits:
            if n.node_id == earlier:
                return n
        return min(fits, key=lambda n: (-n.free_gpus, n.node_id))

    def _end(self, key: str) -> None:
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a["namespace"] == self.namespace and _key(a["name"]) == key:
                with contextlib.suppress(ValueError):  # gone meanwhile
                    ray.kill(ray.get_actor(a["name"], namespace=self.namespace), no_restart=True)

    # -- the launch's side -----------------------------------------------------------------

    def holders(self, key: str) -> dict[str, str]:
        """Live node id -> the path of the key's files there."""
        live = {n.node_id for n in cluster.nodes()}
        entry = CacheEntry.of(self.cache, key)
        return _held(entry, live)

    def forget(self, key: str, node_id: str) -> None:
        """The node no longer holds the files (its actor found them gone): pull again."""
        entry = CacheEntry.of(self.cache, key)
        note = entry.nodes()
        held = {k: v for k, v in (note.get("held") or {}).items() if k != node_id}
        entry.write_nodes({**note, "held": held})

    def model_path(self, entry: Entry) -> str | None:
        source = entry.deployment.spec.source
        if source is None:
            return None
        paths = sorted(self.holders(source.key).items())
        return paths[0][1] if paths else None

    def used(self, entry: Entry, at: datetime) -> None:
        source = entry.deployment.spec.source
        if source is not None:
            CacheEntry.of(self.cache, source.key).mark_used(entry.name, at)


def _hub_env() -> dict[str, Any] | None:
    env = {k: v for k in HUB_ENV if (v := os.environ.get(k))}
    return {"env_vars": env} if env else None


def _key(actor: str) -> str:
    return actor.partition(".")[0]


def _short(nodes: Iterable[str]) -> frozenset[str]:
    """Node ids as a cluster's devices name their node (``Device.node``)."""
    return frozenset(short(n) for n in nodes)


def _held(entry: CacheEntry, live: set[str]) -> dict[str, str]:
    held = entry.nodes().get("held") or {}
    return {
        node: str(copy["path"])
        for node, copy in held.items()
        if node in live and isinstance(copy, dict) and copy.get("path")
    }
