"""Where a container image is being pulled, or was, on a Ray cluster.

An image is pulled by the node that will run it: before the start is placed
(``imagefetch.py``), or by the container wrapper inside the engine's actor when Ray put
that actor on a node without it (the actor says "pulling image" and is ended, and the
start waits: Pulling). Left to Ray's default packing, the next attempt may land on
another node, which pulls the image again: a vLLM image is gigabytes, so a cron pass a
minute could start a pull on every node in turn. So the node is noted here, per image
(``imagefetch.image_key``: its runtime and reference), and the next look and launch ask
Ray for it (a soft affinity: a node lost or full since, the engine goes elsewhere and
pulls there). The note is a file of the state dir (``<state>/images/ray-nodes.json``),
not the backend's memory, so ``--once`` from cron keeps it too; an image's entry goes
once a container of it runs. (An entry an earlier version keyed by record name is never
asked for.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.store.documents import Document, check_version
from controller.store.statedir import StateDir

VERSION = 1
Nodes = dict[str, str]  # image key -> the Ray node id pulling (or holding) the image


def _decode(data: Any) -> Nodes:
    check_version(data, VERSION)
    nodes = data["nodes"]
    if not isinstance(nodes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in nodes.items()
    ):
        raise ValueError("nodes is not an object of node ids")
    return dict(nodes)


def _encode(nodes: Nodes) -> Any:
    return {"version": VERSION, "nodes": nodes}


class ImageNodes:
    """The note: which node pulls which image."""

    def __init__(self, state_dir: str) -> None:
        state = StateDir(Path(state_dir))
        self.doc = Document(state, state.images / "ray-nodes.json", _decode, _encode)

    def node_of(self, key: str) -> str | None:
        return (self.doc.read() or {}).get(key)

    def note(self, key: str, node_id: str) -> None:
        if self.node_of(key) != node_id:
            self.doc.update(lambda nodes: {**nodes, key: node_id}, {}, "the image pulls' nodes")

    def forget(self, key: str) -> None:
        if self.node_of(key) is not None:
            self.doc.update(
                lambda nodes: {k: v for k, v in nodes.items() if k != key},
                {},
                "the image pulls' nodes",
            )
