"""`reconcile restart NAME`: ``<state>/restart/<name>.json``, when a restart was asked.

Desired state on disk, as the gateway's activations are: the request is a time, and
every pass (and `reconcile plan`) reads it as input. An instance that started before
it is replaced (rolling where the strategy says so); one started since is not, so the
file needs no clean-up and a crash halfway through a rollout resumes where it was.

While the node is drained nothing new starts, so a restart would only stop the engine
and leave it Pending until the drain ends: ``refusal`` says so, and `reconcile restart`
and the page's button refuse with it instead of asking.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from controller.core.elapsed import BootClock
from controller.core.manifest.names import is_dns1123
from controller.store import sidefiles
from controller.store.node import read_drain
from controller.store.records import write_atomic

FOLDER = "restart"


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def request(state_dir: Path, name: str, at: datetime) -> None:
    """Ask for a new instance of every replica of deployment ``name`` started before ``at``
    (an aware time). Later requests replace earlier ones."""
    if not is_dns1123(name):  # invariant 9: only deployment names become file names
        raise ValueError(f"not a deployment name: {name!r}")
    if at.tzinfo is None:
        raise ValueError("a restart request needs an aware time (UTC)")
    where = sidefiles.folder_for_write(folder(state_dir))
    write_atomic(where / f"{name}.json", json.dumps({"requested_at": at.isoformat()}).encode())


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


def read_all(state_dir: Path) -> dict[str, datetime]:
    """Every readable request: deployment name -> when; a torn or foreign file is none
    (named at warning level)."""
    out: dict[str, datetime] = {}
    for path in sidefiles.listed(folder(state_dir), "*.json"):
        if not is_dns1123(path.stem):
            continue  # not a file this tool wrote: never read by a name it did not give
        try:
            at = datetime.fromisoformat(json.loads(path.read_text())["requested_at"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            sidefiles.skipped(path, exc)
            continue
        if at.tzinfo is not None:  # a naive time cannot be compared with records'
            out[path.stem] = at
        else:
            sidefiles.warn(path, "requested_at has no time zone; ignored")
    return out
