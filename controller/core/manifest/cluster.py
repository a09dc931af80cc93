"""What a manifest may ask of a cluster backend (Ray). Pure.

On one node the planner picks exact devices and ports; on a cluster the cluster
places the engine, so the fields that name a node's own devices or ports have no
meaning there and are refused (by `validate` and `plan`) instead of ignored.
"""

from __future__ import annotations

from controller.core.manifest.backendnames import on_cluster
from controller.core.manifest.specs import DeploymentSpec

# Device kinds a cluster backend can ask for: Ray's GPU resource is the NVIDIA (CUDA) one.
CLUSTER_KINDS = ("nvidia", "any")


def cluster_refusals(spec: DeploymentSpec, backend: str) -> list[tuple[str, str]]:
    """(field path, why) for each field the backend cannot honour; empty on one node."""
    if not on_cluster(backend):
        return []
    out = []
    if spec.devices.candidates is not None:
        out.append(
            (
                "spec.devices.candidates",
                "has no meaning on the ray backend: Ray chooses the node and its GPUs"
                " (remove it, or run this deployment with --backend local)",
            )
        )
    if spec.port is not None:
        out.append(
            (
                "spec.port",
                "an exact port cannot be promised on a node the ray backend chooses: use"
                " spec.basePort (the engine gets the first free port from there on its node)",
            )
        )
    if spec.devices.count > 0 and spec.devices.kind not in CLUSTER_KINDS:
        out.append(
            (
                "spec.devices.kind",
                f"{spec.devices.kind!r} has no Ray mapping: the ray backend asks Ray for"
                " GPUs (num_gpus), which are NVIDIA devices (use kind nvidia or any)",
            )
        )
    return out
