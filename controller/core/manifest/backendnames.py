"""The backend names that configuration and records carry as data, and the one fact the
layers read from a name.

A record says ``backend: "local"|"ray"`` (the record contract) and ``--backend`` takes
one of these. Only this module and ``backends/choose.py`` spell a name: everything else
asks :func:`on_cluster` (or, holding a backend, one of its ``Backend`` properties), so a
new backend is an edit here and in ``choose``, not a hunt for string comparisons.
"""

from __future__ import annotations

LOCAL = "local"  # engines are processes on the node that spawned them
RAY = "ray"  # engines are actors a Ray cluster placed
NAMES: tuple[str, ...] = (LOCAL, RAY)
_CLUSTER: frozenset[str] = frozenset({RAY})


def on_cluster(name: str) -> bool:
    """A cluster backend's name: the cluster picks the node, port and devices, the engine's
    pid and log live on that node, and any node's backend judges its records. Otherwise
    the node that spawned the engine alone judges it, by its pid (invariant 6)."""
    return name in _CLUSTER
