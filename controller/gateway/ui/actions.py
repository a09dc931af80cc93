"""The page's actions, each written as desired state the next pass reads (never a
manifest: the folder stays the truth), each with an event naming the key that asked.

- load: an activation, as a request writes it (an OnDemand deployment starts);
- unload: an activation marked released (the planner parks it; the next request's
  activation, not released, starts it again);
- restart: a restart request (``store/side/restart.py``, as ``reconcile restart`` writes),
  refused (409) while the node is drained, as ``reconcile restart`` refuses it;
- drain / uncordon: the node's drain file, as ``reconcile drain`` / ``uncordon`` do.

Call them off the gateway's loop (they write files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from controller.core.replicaset import group
from controller.core.state import Activation, Drain, Record
from controller.host import bootclock
from controller.store.config.node import clear_drain, write_drain
from controller.store.instances.events import Journal
from controller.store.side import activation, restart

DRAIN_TTL = 3600.0  # seconds, as `reconcile drain`'s default --ttl
NODE_ACTIONS = ("drain", "uncordon")
DEPLOYMENT_ACTIONS = ("load", "unload", "restart")


class Refused(ValueError):
    """An action that cannot be done as asked: the page shows the message (a 4xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Asked:
    action: str
    name: str  # the deployment; "" for a node action
    key: str  # the key's label; "-" when keys are off
    reason: str = ""


def who(key: str) -> str:
    return "the web page (no API keys)" if key == "-" else f"the web page, key {key}"


def run(state_dir: Path, records: Sequence[Record], asked: Asked) -> str:
    """Do what was asked; the sentence the page shows. Refused: what is wrong."""
    if asked.action in NODE_ACTIONS:
        return _node(state_dir, records, asked)
    if asked.action not in DEPLOYMENT_ACTIONS:
        known = ", ".join((*DEPLOYMENT_ACTIONS, *NODE_ACTIONS))
        raise Refused(404, f"no action {asked.action!r} (the page's actions: {known})")
    if not asked.name:  # a bad request, not a deployment that is missing (a 404)
        raise Refused(400, f'{asked.action} needs a deployment: send {{"name": NAME}}')
    sets = {rs.name: rs for rs in group(records)}
    rs = sets.get(asked.name)
    if rs is None:
        raise Refused(404, f"no deployment named {asked.name!r} in {state_dir}")
    now = datetime.now(UTC)
    if asked.action == "restart":
        refused = restart.refusal(state_dir, rs.name, now, bootclock.read())
        if refused is not None:
            raise Refused(409, refused)
        restart.request(state_dir, rs.name, now)
        said = f"restart of {rs.name} asked by {who(asked.key)}"
    else:
        if not rs.first.on_demand:
            raise Refused(
                409,
                f"{rs.name} is not OnDemand (spec.activation): it runs while its manifest "
                "says so; load and unload are for OnDemand deployments",
            )
        released = asked.action == "unload"
        act = Activation(last_request_at=now, released=released, boot=bootclock.read())
        activation.write(state_dir, rs.name, act)
        said = f"{asked.action} of {rs.name} asked by {who(asked.key)}"
    Journal(state_dir).append(rs.name, asked.action, said, "requested", key=asked.key)
    return said


def _node(state_dir: Path, records: Sequence[Record], asked: Asked) -> str:
    if asked.action == "drain":
        now, boot = datetime.now(UTC), bootclock.read()
        drain = Drain.asked(now, DRAIN_TTL, boot, reason=asked.reason, by=who(asked.key))
        write_drain(state_dir, drain)
        until = drain.until.isoformat(timespec="seconds")
        said = f"node drained by {who(asked.key)} until {until}"
    elif clear_drain(state_dir):
        said = f"node uncordoned by {who(asked.key)}"
    else:
        return "the node was not drained"
    # A node has no journal of its own: each deployment's says what happened to it.
    journal = Journal(state_dir)
    for rs in group(records):
        journal.append(rs.name, asked.action, said, "done", key=asked.key)
    return said
