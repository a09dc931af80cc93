"""The pull actor: one model pull on one Ray node, into that node's model cache.

A small detached actor (no GPU, a token of CPU, pinned to its node) runs the pull code
of ``controller/pull`` (lock, fetch with Range resume, sha256, result) on a thread and
answers how it goes (:meth:`ModelPull.look`). Holding no GPU is the point: an engine's
actor would sit on its GPUs for the whole download.

The node's cache is ``RECONCILE_MODEL_CACHE`` as the node sees it (a disk of its own,
or a filesystem every node mounts), else ``<tmp>/reconcile-ray/<namespace>/models``:
the same content keys as any cache, so a second pull of a file the node holds is done
at once. A killed actor is restarted by Ray on the same node and resumes the
``.partial`` file; one gone for good is replaced by the next pass.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import ray

from controller.core.pulls import PullView
from controller.pull.job import Job
from controller.store.models import modelcache
from controller.store.models.modelcache import CacheEntry


def node_root(state_key: str) -> Path:
    """This node's folder of our namespace (the engine actors' logs live there too)."""
    return Path(tempfile.gettempdir()) / "reconcile-ray" / state_key


def node_cache(state_key: str) -> Path:
    configured = os.environ.get(modelcache.ENV)
    return Path(configured).expanduser() if configured else node_root(state_key) / "models"


@dataclass(frozen=True, slots=True)
class PullAnswer:
    """One pull actor's answer: its node, the key's state there, and the file once done."""

    node_id: str
    host: str
    view: PullView
    deployments: tuple[str, ...]  # who waits for it (their journals hear of the outcome)
    path: str | None = None  # the checked file or snapshot folder, on that node
    sha256: str | None = None
    bytes: int = 0


class ModelPull:
    def __init__(self, job: Job, state_key: str) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        root = node_root(state_key)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The journal is on the reconcile host: the driver writes the outcome there.
        self.deployments = job.deployments
        self.job = dataclasses.replace(
            job, cache=node_cache(state_key), state_dir=root, deployments=()
        )
        self.entry = CacheEntry.of(self.job.cache, job.source.key)
        self.entry.ensure()
        # Imported here, on the node: the driver imports this module at every start (each
        # Ray CLI call) and never fetches a file itself (``actor.py`` says what that costs).
        from controller.pull import worker

        self.thread = threading.Thread(
            target=worker.run, args=(self.job,), name="pull", daemon=True
        )
        self.thread.start()

    def look(self) -> PullAnswer:
        view = modelcache.look(self.entry, running=self.thread.is_alive())
        path = self.entry.model_path() if view.cached else None
        result = self.entry.result() or {}
        digest = result.get("sha256")
        size = result.get("bytes")
        return PullAnswer(
            node_id=self.node_id,
            host=self.host,
            view=view,
            deployments=self.deployments,
            path=str(path) if path is not None else None,
            sha256=digest if isinstance(digest, str) else None,
            bytes=size if isinstance(size, int) else 0,
        )
