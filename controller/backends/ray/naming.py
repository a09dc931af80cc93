"""Ray namespaces and actor names: how an actor is tied to a record, and to nothing else.

A namespace per (state dir, owner): two manifest sets, or two reconcile hosts, sharing
a cluster never see (or reap) each other's actors. The actor name carries the
instance's nonce, like the ``RECONCILE_INSTANCE`` marker of a local engine.
"""

from __future__ import annotations

from controller.core.digest import sha256_hex

PREFIX = "reconcile-"


def namespace(state_dir: str, owner: str) -> str:
    return PREFIX + sha256_hex(f"{state_dir}\0{owner}".encode())[:16]


def actor_name(name: str, nonce: str) -> str:
    # A DNS-1123 name has no '.', so the last '.' separates the nonce.
    return f"{name}.{nonce}"


def parse(actor: str) -> tuple[str, str] | None:
    """(deployment, nonce) of one of our actor names, else None."""
    name, dot, nonce = actor.rpartition(".")
    return (name, nonce) if dot and name and nonce else None


def short(node_id: str) -> str:
    """A Ray node id as tables show it (the record keeps the full hex)."""
    return node_id[:8]


def device_key(node_id: str, gpu: str) -> str:
    """A cluster GPU in the records' ``kind:id`` form: unique across nodes."""
    return f"nvidia:{short(node_id)}/{gpu}"


def node_of(key: str) -> str:
    """The short node id in a cluster GPU's key (:func:`device_key`'s inverse)."""
    return key.partition(":")[2].partition("/")[0]
