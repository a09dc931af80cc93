"""Notifications (node.yaml ``notify:``): what is sent, and the queue on disk it waits in.

``notify: [{url: https://hooks.example/x, events: [Failed, RolledBack, Synced]}]``: one
JSON POST per event a hook lists, with ``event``, ``node``, ``source``, ``revision``,
``message``, ``deployments`` and a Slack-compatible ``text``. The pass only *queues*: one
file per (hook, notification) under ``<state>/notify/``, written atomically, named so
that the oldest sorts first; the daemon's sender (daemon/webhooks.py) posts them off the
pass and removes each after a 2xx. Past :data:`MAX_QUEUED` files the oldest are dropped,
each named in a warning and counted (``reconcile_notifications_total{result="dropped"}``).

A queued file names its hook by a digest of the URL, never the URL itself: a Slack or
Teams hook's URL *is* its secret, and the state dir keeps no secret. A hook removed from
node.yaml leaves its queued files undeliverable: the sender drops them, said once.
No payload holds a URL's user:password (the source is shown without it) or a secret value:
messages are the events' own words, with any URL's userinfo taken out again here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controller.logsetup import get_logger
from controller.redact import REDACTED, URL_SECRET
from controller.store import sidefiles
from controller.store.documents import write_atomic
from controller.store.statedir import StateDir

log = get_logger("reconcile")

# The events a hook may list: the git source's states (gitsource.STATES, as `reconcile
# source` names them), a deployment entering Failed or BackOff (the executor's `fail`),
# a rollback (`reconcile rollback`, or autoRollback), a device marked Unhealthy.
SOURCE_EVENTS = ("Synced", "Progressing", "Degraded", "PullFailed", "Pinned", "Unverified")
EVENTS = (*SOURCE_EVENTS, "Failed", "BackOff", "RolledBack", "Unhealthy")
MAX_QUEUED = 500  # files; past this the oldest are dropped (a hook down for days)
PATTERN = "q-*.json"
_USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


@dataclass(frozen=True, slots=True)
class Hook:
    url: str
    events: frozenset[str]

    @property
    def id(self) -> str:
        """What a queued file calls its hook: the URL's digest (the URL may be a secret)."""
        return hashlib.sha256(self.url.encode()).hexdigest()[:16]

    @property
    def shown(self) -> str:
        """The hook as logs and events name it: scheme and host only (its path may be
        the token, as Slack's is)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"


def scrub(text: str) -> str:
    """Words fit for a payload: no URL keeps a user:password or a secret query value
    (``?token=<redacted>``)."""
    return URL_SECRET.sub(rf"\1{REDACTED}", _USERINFO.sub(r"\1", text))


def payload(
    event: str,
    *,
    node: str,
    source: str,
    revision: str | None,
    message: str,
    deployments: Sequence[str] = (),
) -> dict[str, Any]:
    message = scrub(message)
    names = sorted(set(deployments))
    about = f" ({', '.join(names)})" if names else ""
    # The revision once: a message that names it already (a source's) says it again not.
    at = f" at {revision[:12]}" if revision and revision[:12] not in message else ""
    return {
        "event": event,
        "node": node,
        "source": scrub(source),
        "revision": revision,
        "message": message,
        "deployments": names,
        "text": f"[{node}] {event}{about}: {message}{at}",
    }


@dataclass(frozen=True, slots=True)
class Queued:
    path: Path
    hook: str  # Hook.id
    body: dict[str, Any]


class Outbox:
    """``<state>/notify/``: one file per notification to deliver, oldest first."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = StateDir(state_dir).notify

    def put(self, hook: Hook, body: dict[str, Any]) -> None:
        """Queue one notification (atomically: a file is whole or absent); a full queue
        drops its oldest. A queue that cannot be written is warned about: a pass never
        fails for a notification."""
        nid = uuid.uuid4().hex[:12]
        name = f"q-{time.time_ns():020d}-{hook.id}-{nid}.json"
        data = json.dumps({"id": nid, **body}, default=str).encode()
        try:
            write_atomic(sidefiles.folder_for_write(self.folder) / name, data)
        except OSError as exc:
            sidefiles.warn(self.folder, f"notification not queued: {exc}")
            return
        self._bound()

    def _bound(self) -> None:
        files = list(sidefiles.listed(self.folder, PATTERN))
        for old in files[: max(len(files) - MAX_QUEUED, 0)]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
                log.warning("notification dropped: the queue is full", file=old.name,
                            queued=MAX_QUEUED)  # fmt: skip
                DROPPED.add()

    def pending(self) -> list[Queued]:
        """What waits, oldest first (a file torn or not ours is skipped, named once)."""
        out = []
        for path in sidefiles.listed(self.folder, PATTERN):
            try:
                body = json.loads(path.read_bytes())
            except FileNotFoundError:
                continue  # delivered or dropped meanwhile
            except (OSError, ValueError) as exc:
                sidefiles.skipped(path, exc)
                continue
            parts = path.name.split("-")
            if isinstance(body, dict) and len(parts) == 4:
                out.append(Queued(path, parts[2], body))
        return out

    def remove(self, item: Queued) -> None:
        with contextlib.suppress(FileNotFoundError):
            item.path.unlink()


class _Count:
    """Files this process dropped (the daemon's metrics read it from their thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


DROPPED = _Count()


class Notifications:
    """Queues the events the hooks asked for; the callers are where each event happens."""

    def __init__(self, state_dir: Path, hooks: Iterable[Hook], *, node: str, source: str) -> None:
        self.state_dir = state_dir
        self.hooks = tuple(hooks)
        self.node = node
        self.source = source
        self.outbox = Outbox(state_dir)

    def emit(
        self,
        event: str,
        message: str,
        *,
        revision: str | None = None,
        deployments: Sequence[str] = (),
    ) -> None:
        wanted = [h for h in self.hooks if event in h.events]
        if not wanted:
            return
        body = payload(
            event,
            node=self.node,
            source=self.source,
            revision=revision,
            message=message,
            deployments=deployments,
        )
        for hook in wanted:
            self.outbox.put(hook, body)

    def source_state(
        self, state: str, message: str, revision: str | None, deployments: Sequence[str] = ()
    ) -> None:
        """The git source's state, notified when it or the applied commit differs from the
        last one noted (kept on disk: a restart in the same state says nothing again; a
        new commit Synced is news)."""
        path = StateDir(self.state_dir).notify_source_state
        try:
            last = json.loads(path.read_bytes())
        except (OSError, ValueError):
            last = None
        if isinstance(last, dict) and (last.get("state"), last.get("revision")) == (
            state,
            revision,
        ):
            return
        self.emit(state, message, revision=revision, deployments=deployments)
        with contextlib.suppress(OSError):
            sidefiles.folder_for_write(path.parent)
            write_atomic(path, json.dumps({"state": state, "revision": revision}).encode())
