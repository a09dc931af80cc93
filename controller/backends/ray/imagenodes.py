"""Where an instance's container image is being pulled on a Ray cluster.

An image is pulled by the node that will run it (the container wrapper, inside the
engine's actor): the actor says "pulling image" and is ended, and the start waits
(Pulling). Left to Ray's default packing, the next attempt may land on another node,
which pulls the image again: a vLLM image is gigabytes, so a cron pass a minute could
start a pull on every node in turn. So the node is noted here, per record, and the next
launch of that record asks Ray for it (a soft affinity: a node lost or full since, the
engine goes elsewhere and pulls there). The note is a file of the state dir
(``<state>/images/ray-nodes.json``), not the backend's memory, so ``--once`` from cron
keeps it too; a record's entry goes once its container runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.store.documents import Document, check_version
from controller.store.statedir import StateDir

VERSION = 1
Nodes = dict[str, str]  # record name -> the Ray node id pulling its image


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
    """The note: which node pulls which record's image."""

    def __init__(self, state_dir: str) -> None:
        state = StateDir(Path(state_dir))
        self.doc = Document(state, state.images / "ray-nodes.json", _decode, _encode)

    def node_of(self, record: str) -> str | None:
        return (self.doc.read() or {}).get(record)

    def note(self, record: str, node_id: str) -> None:
        self.doc.update(lambda nodes: {**nodes, record: node_id}, {}, "the image pulls' nodes")

    def forget(self, record: str) -> None:
        if self.node_of(record) is not None:
            self.doc.update(
                lambda nodes: {k: v for k, v in nodes.items() if k != record},
                {},
                "the image pulls' nodes",
            )
