"""What the ray backend is, and what it leaves to the nodes (pulls, images, env files).

Both faces of the ray backend (``RayBackend`` in the driver process, ``RayProxy`` in
this one) declare the same facts, and answer the same way for what lives on the
engines' nodes, out of the driver's reach: an actor starts its container on its node,
with an image fetched there before it was placed, or before a recreate stopped the
engine it replaces (``imagefetch.py``, through the driver: not here). No ``ray`` import here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from controller.backends.base import CommandLine, ExitStatus, StartRequest
from controller.core.manifest import backendnames
from controller.core.manifest.specs import DeploymentSpec
from controller.core.state import Record


class OnTheirNodes:
    name = backendnames.RAY
    launch_concurrency = 16  # each launch waits seconds for Ray to place and start a worker
    places_engines = True  # Ray picks the node and its GPUs; the actor picks the port there
    exits_watchable = False  # the pid is on another machine; the actor restarts it there
    selects_nodes = True  # spec.nodeSelector chooses among the Ray nodes, by their labels

    def drop_unused_pulls(self, specs: Iterable[DeploymentSpec]) -> int:
        return 0  # an actor pulls into a folder of its own node, out of the driver's reach

    def drop_unused_env_files(self, records: Callable[[], Iterable[Record]]) -> int:
        return 0  # an actor starts its container on its own node, out of the driver's reach

    def late_exit(self, rec: Record) -> ExitStatus | None:
        return None  # an actor reads its engine's exit on its node, as it ends

    def previous_exit(self, rec: Record) -> ExitStatus | None:
        return None  # a cluster's restart keeps no container of its own to read

    def prove_ours(self, rec: Record) -> None:
        return None  # an actor's engine is its own unreaped child: ours by construction

    def command_line(self, launch: StartRequest) -> CommandLine | None:
        return None  # an actor renders its engine on its node, with the port it finds there

    def runtime_log(self, rec: Record) -> list[str] | None:
        return None  # an actor reads its engine's log on its node (log_since)

    def signal_stop(self, rec: Record) -> bool:
        return False  # an engine stops through its actor, by ``teardown`` (grace and all)

    def stopped(self, rec: Record) -> bool:
        return True  # ``signal_stop`` begins nothing here: ``teardown`` does all of it

    def remains(self, rec: Record) -> bool:
        return False  # an actor's engine ends whole with it, on its node
