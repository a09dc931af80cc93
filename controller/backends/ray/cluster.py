"""The connection to a Ray cluster, its GPUs as an inventory, and why a spec does not fit.

Every ``ray`` call that asks the cluster about itself is here, behind typed functions:
``ray`` ships partial type information, so its values are narrowed once, here.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from controller.backends.ray.address import reachable
from controller.backends.ray.naming import device_key, short
from controller.core.devices.inventory import Device, Inventory
from controller.core.manifest.labels import matches, pairs
from controller.errors import BackendUnavailable

# Ray places a request for no resource at all on any node, whatever its node affinity
# says (ray-project/ray#25360 fixed that for hard affinity only): an actor that needs no
# GPU (a CPU replica, a model pull) asks for this token of CPU so its affinity holds.
TOKEN_CPU = 0.001


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    address: str
    gpus: int  # total
    free_gpus: float  # available now
    # The node's labels (`ray start --labels`), Ray's own ray.io/ ones included:
    # spec.nodeSelector is matched against them.
    labels: Mapping[str, str] = field(default_factory=dict)


def connect(address: str) -> None:
    """Join the cluster as a driver, once per process; unreachable → BackendUnavailable."""
    if ray.is_initialized():
        return
    reachable(address)
    try:
        ray.init(
            address=address,
            log_to_driver=False,  # engines' output goes to their log, not our terminal
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        raise BackendUnavailable(f"cannot join the Ray cluster at {address}: {exc}") from exc


def nodes(free: dict[str, float] | None = None) -> list[Node]:
    """The live nodes, each with its GPUs and how many are free now (``free``: read already)."""
    free = _free_per_node() if free is None else free
    out = []
    for raw in ray.nodes():  # type: ignore[no-untyped-call]
        info: dict[str, Any] = dict(raw)
        if not info.get("Alive"):
            continue
        node_id = str(info["NodeID"])
        total = float(dict(info.get("Resources") or {}).get("GPU", 0.0))
        out.append(
            Node(
                node_id=node_id,
                address=str(info.get("NodeManagerAddress", "")),
                gpus=int(total),
                free_gpus=free.get(node_id, 0.0),
                labels={str(k): str(v) for k, v in dict(info.get("Labels") or {}).items()},
            )
        )
    return out


def selected(live: Sequence[Node], selector: Mapping[str, str]) -> list[Node]:
    """The nodes whose labels hold every pair of ``selector`` (all of them: none given)."""
    return [n for n in live if matches(selector, n.labels)]


def _free_per_node() -> dict[str, float]:
    # Ray's public API gives cluster-wide availability only; the per-node table is what
    # `ray status` reads. Should it move, we fall back to "unknown" (0 free, no refusal).
    with contextlib.suppress(ImportError, AttributeError):
        from ray._private import state

        table: dict[str, dict[str, float]] = state.available_resources_per_node()  # type: ignore[no-untyped-call]
        return {node: float(res.get("GPU", 0.0)) for node, res in table.items()}
    return {}


def free_gpus(node_id: str) -> float | None:
    """The GPUs free on one node now; None when Ray does not say."""
    free = _free_per_node()
    return free.get(node_id, 0.0) if free else None


def inventory() -> Inventory:
    """Every GPU of the live nodes, keyed ``nvidia:<node>/<gpu>`` (the planner's capacity)."""
    devices = [
        Device(
            kind="nvidia",
            id=device_key(n.node_id, str(i)).partition(":")[2],
            node=short(n.node_id),
            labels=tuple(sorted(n.labels.items())),
        )
        for n in nodes()
        for i in range(n.gpus)
    ]
    return Inventory(tuple(devices), source="ray")


def unfit(count: int, selector: Mapping[str, str] | None = None) -> str | None:
    """Why no node (of those ``selector`` chooses) can take ``count`` GPUs now, naming
    what is missing; None if one can."""
    if selector:
        live = nodes()
        chosen = selected(live, selector)
        if not chosen:
            return _no_match(selector, live)
    elif count <= 0:
        return None
    free_now = _free_per_node()
    if not free_now or count <= 0:
        return None  # availability unknown: let Ray try (the launch has a timeout)
    live = selected(nodes(free_now), selector or {})
    if any(n.free_gpus >= count for n in live):
        return None
    free = sum(n.free_gpus for n in live)
    plural = "s" if count != 1 else ""
    where = f"Ray node matching nodeSelector {pairs(selector)}" if selector else "Ray node"
    them = "matching: " if selector else "cluster: "
    return (
        f"no {where} has {count} free GPU{plural}; {them}{len(live)} node"
        f"{'s' if len(live) != 1 else ''}, {free:g} GPU{'s' if free != 1 else ''} free"
        f" (add a node{' with these labels' if selector else ''}, or stop a deployment)"
    )


def _no_match(selector: Mapping[str, str], live: Sequence[Node]) -> str:
    """No live node carries the selector's labels: say which labels the nodes do carry."""
    seen = Counter(pairs(_own(n.labels)) or "none" for n in live)
    carried = ", ".join(f"{labels} ({count})" for labels, count in sorted(seen.items()))
    return (
        f"no Ray node matches nodeSelector {pairs(selector)}; the {len(live)} live nodes'"
        f" labels: {carried or 'no node'}. Label a node (`ray start --labels"
        f" {pairs(selector)}`) or change spec.nodeSelector"
    )


def _own(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels people gave a node (Ray's own ray.io/ ones are ids and types)."""
    return {k: v for k, v in labels.items() if not k.startswith("ray.io/")}
