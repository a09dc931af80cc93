"""The actor: one per deployment instance, on the node Ray chose; it owns the engine there.

``EngineHost`` is the class the driver names (``ray.remote(EngineHost)``) and the one that
answers its calls. The engine's life on the node (the local backend's spawn, the container
runtimes, the ports, the back-off) is ``nodeengine.NodeEngine``'s, imported when the
actor starts, there: the driver process imports this module at every start, which is each
Ray CLI call, and those imports were ~0.12 s of its ~0.9 s of CPU, for nothing.
"""

from __future__ import annotations

from controller.backends.ray.enginejob import EngineJob, HostStatus


class EngineHost:
    def __init__(self, job: EngineJob) -> None:
        from controller.backends.ray.nodeengine import NodeEngine  # on the node (above)

        self.engine = NodeEngine(job)

    # -- what the driver calls ------------------------------------------------------

    def status(self) -> HostStatus:
        return self.engine.status()

    def log_tail(self, count: int) -> list[str]:
        return self.engine.log_tail(count)

    def log_since(self, offset: int) -> tuple[bytes, int]:
        """The log from ``offset`` on (all of it from 0), and the offset to ask next."""
        return self.engine.log_since(offset)

    def stop(self, sig: int, grace: float) -> None:
        """Stop supervising, then the engine: the stop signal, grace, SIGKILL, sweep."""
        self.engine.stop(sig, grace)
