"""What the driver and an engine's actor share: the job it sends (``EngineJob``), the
actor's answer (``HostStatus``), the words of a status both read, and the node's folder.

Light on purpose: the driver process imports it (with ``actor.py``) at every start, each
Ray CLI call; the engine's machinery is ``nodeengine.py``'s, imported on the node only.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from controller.core.manifest.specs import Entry
from controller.core.state import ContainerRef, ProcessRef

MISSING_MODEL = "the model files"  # how a status says the node lacks them (the driver forgets it)
PULLING_IMAGE = "pulling image"  # how the container wrapper says its image is on its way


@dataclass(frozen=True, slots=True)
class EngineJob:
    """What the driver sends: picklable values only (the actor may restart anywhere)."""

    entry: Entry
    nonce: str
    state_key: str  # our namespace: separates owners' engines and logs on a node
    base_port: int  # the planner's port: tried first
    # The record it runs (a replica `web@1`, a `@next`): its log, marker and sweep are
    # this record's, so two replicas (or an update's old and new) on one node never
    # share a log or kill each other's engine as a leftover.
    record: str = ""
    # ``{model}`` of a spec.source: the file a pull actor pulled into this node's model
    # cache (the launch pins the actor to a node that holds it); the spawn checks.
    model_path: str | None = None

    @property
    def name(self) -> str:
        return self.record or self.entry.name


@dataclass(frozen=True, slots=True)
class HostStatus:
    """One actor's answer: where its engine runs, or why it does not."""

    node_id: str
    host: str
    devices: tuple[str, ...]
    port: int | None
    ref: ProcessRef | None  # the engine now; None while it is (re)started
    message: str
    ended: tuple[int | None, int | None] | None  # (code, signal) when it will not restart
    container: ContainerRef | None = None  # the engine's container (None: a process)


def node_root(state_key: str) -> Path:
    """This node's folder of our namespace (made here): the engines' logs, and the
    container wrapper's state (its image pulls: ``imagefetch.py`` reads them too)."""
    root = Path(tempfile.gettempdir()) / "reconcile-ray" / state_key
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root
