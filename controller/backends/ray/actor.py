"""The actor: one per deployment instance, on the node Ray chose; it owns the engine there.

``EngineHost`` is the class the driver names (``ray.remote(EngineHost)``) and the one that
answers its calls, with the job it is sent (``EngineJob``) and its answer (``HostStatus``):
what an actor and a driver of another release must both read, so they stay here. The
engine's life on the node (the local backend's spawn, the container runtimes, the ports,
the back-off) is ``nodeengine.NodeEngine``'s, imported when the actor starts, there: the
driver process imports this module at every start, which is each Ray CLI call, and those
imports were ~0.12 s of its ~0.9 s of CPU, for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.backends.ray.naming import device_key
from controller.core.manifest.specs import Entry
from controller.core.state import ContainerRef, ProcessRef


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


class EngineHost:
    def __init__(self, job: EngineJob) -> None:
        from controller.backends.ray.nodeengine import NodeEngine  # on the node (above)

        self.engine = NodeEngine(job)

    # -- what the driver calls ------------------------------------------------------

    def status(self) -> HostStatus:
        engine = self.engine
        with engine.lock:
            return HostStatus(
                node_id=engine.node_id,
                host=engine.address,
                devices=tuple(device_key(engine.node_id, g) for g in engine.gpus),
                port=engine.port,
                ref=engine.ref,
                message=engine.message,
                ended=engine.ended,
                container=engine.container,
            )

    def log_tail(self, count: int) -> list[str]:
        return self.engine.log_tail(count)

    def log_since(self, offset: int) -> tuple[bytes, int]:
        """The log from ``offset`` on (all of it from 0), and the offset to ask next."""
        return self.engine.log_since(offset)

    def stop(self, sig: int, grace: float) -> None:
        """Stop supervising, then the engine: the stop signal, grace, SIGKILL, sweep."""
        self.engine.stop(sig, grace)
