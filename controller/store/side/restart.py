"""`reconcile restart NAME`: ``<state>/restart/<name>.json``, when a restart was asked.

Desired state on disk, as the gateway's activations are: the request is a time, and
every pass (and `reconcile plan`) reads it as input. An instance that started before
it is replaced (rolling where the strategy says so); one started since is not, so the
file needs no clean-up and a crash halfway through a rollout resumes where it was.
A torn or foreign file (a naive time among them) is quarantined and is no request.

While the node is drained nothing new starts, so a restart would only stop the engine
and leave it Pending until the drain ends: ``refusal`` says so, and `reconcile restart`
and the page's button refuse with it instead of asking.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.elapsed import BootClock
from controller.store.config.node import read_drain
from controller.store.documents import Folder
from controller.store.statedir import StateDir


def _decode(data: Any, name: str) -> datetime:
    at = datetime.fromisoformat(data["requested_at"])
    if at.tzinfo is None:  # a naive time cannot be compared with records'
        raise ValueError("requested_at has no time zone")
    return at


def _folder(state_dir: Path) -> Folder[datetime]:
    state = StateDir(state_dir)
    return Folder(state, state.restart, _decode, lambda at: {"requested_at": at.isoformat()})


def request(state_dir: Path, name: str, at: datetime) -> None:
    """Ask for a new instance of every replica of deployment ``name`` started before ``at``
    (an aware time). Later requests replace earlier ones."""
    if at.tzinfo is None:
        raise ValueError("a restart request needs an aware time (UTC)")
    _folder(state_dir).write(name, at)  # invariant 9: only deployment names


def refusal(state_dir: Path, name: str, now: datetime, clock: BootClock | None) -> str | None:
    """Why a restart of ``name`` is refused now (None: it is not): the node is drained
    (``clock``: the boot clock now, which the drain's ttl runs on). An unreadable drain
    file raises ConfigError, as every reader of it does."""
    drain = read_drain(state_dir)
    if drain is None or not drain.active(now, clock):
        return None
    by = f" by {drain.by}" if drain.by else ""
    why = f" ({drain.reason})" if drain.reason else ""
    until = drain.ends(now, clock).isoformat(timespec="seconds")
    return (
        f"the node is drained{by}{why} until {until}: nothing new starts, so restarting "
        f"{name} would stop its engine and leave it Pending until the drain ends. Run "
        f"`reconcile uncordon` first, then restart it"
    )


def read_all(state_dir: Path, *, peek: bool = False) -> dict[str, datetime]:
    """Every readable request: deployment name -> when; a torn or foreign file is none
    (named; quarantined unless ``peek``)."""
    return _folder(state_dir).read_all(peek=peek)
