"""A container's volumes as this node holds them (DESIGN.md "Engines in containers").

A volume's host folder must exist before its container starts, on both runtimes: podman
refuses a missing one, docker makes it (empty and root's) and runs the engine on nothing,
so the same manifest ran on one and died on the other. As Kubernetes' ``hostPath`` of
``type: Directory``, reconcile makes nothing: the deployment is left not Ready (Pending
if it never ran, a running engine untouched: the planner's invalid-spec rule), its
message naming the manifest's file, line and field, until the folder is there.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.core.manifest.specs import Entry
from controller.store.sources.manifests import LoadResult, ManifestError


def refuse_missing_volumes(loaded: LoadResult, *, here: Callable[[Entry], bool]) -> None:
    """Each entry this node runs (``here``) a volume of which names a host path this
    node lacks becomes invalid (another node's deployment mounts that node's folders)."""
    boxed = [(n, e) for n, e in loaded.entries.items() if e.deployment.spec.container and here(e)]
    if not boxed:
        return  # a node that runs no container loads no container code (tests/test_imports)
    from controller.host import containers

    for name, entry in boxed:
        container = entry.deployment.spec.container
        missing = containers.missing_volume(container.volumes) if container else None
        if missing is None:
            continue
        index, host = missing
        error = loaded.error(ManifestError(
            entry.source, loaded.line_of(entry, ("spec", "container", "volumes", index)),
            f"spec.container.volumes[{index}]", containers.missing_folder(host), name,
        ))  # fmt: skip
        del loaded.entries[name]
        loaded.errors.append(error)
        loaded.invalid_names[name] = str(error)
