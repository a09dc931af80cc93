"""A container engine's exit its pass could not read then, read once its runtime answers.

An engine that ended while docker's daemon was down (its `run` lost its stream: no code)
is judged by the pass that sees it dead: `exited (code unknown: ...)`, its container's
removal refused. The container stays (no `--rm`), its State keeping the code; its exit
file says it is still to remove. A later pass, the runtime answering, reads that State
into the record's last exit (and its message), as kubelet reads a container's last
state after its runtime restarts, and removes the container.

A restart planned before the runtime answered keeps that run (``Record.unread_exit``:
its container and nonce), so its container is not removed unread as one no record
names: once read, its code is the record's last exit (Kubernetes' lastState), unless a
later exit took its place. Either way the journal, which said "code unknown", is told
the code once (an ``exit`` event: the code, and OOMKilled where the runtime says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

from controller.backends.base import Backend, ExitStatus
from controller.core.state import OOM_KILLED, ExitInfo, Phase, Record
from controller.logsetup import get_logger
from controller.store.instances.records import RecordStore

log = get_logger("reconcile")

# Where a record keeps the exit of the engine it still names (no restart since).
ENDED = (Phase.FAILED, Phase.BACKOFF, Phase.SUCCEEDED)
ACTION = "exit"  # the journal's word for an exit read late


class Say(Protocol):
    """The executor's ``event``: one journal entry (and its log line)."""

    def __call__(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None:
        """Journal ``action`` of ``name``."""


def read_late(store: RecordStore, backend: Backend, records: Iterable[Record], say: Say) -> int:
    """Fill in the last exit of each record in ``records`` (the pass's view; each read
    again before it is written) whose engine's code was unknown, or whose run before a
    restart was, and whose runtime says it now; how many. The pass lock is held."""
    filled = 0
    for seen in records:
        if _unread(seen):
            filled += _read_own(store, backend, seen, say)
        elif seen.unread_exit is not None:
            filled += _read_previous(store, backend, seen, say)
    return filled


def _read_own(store: RecordStore, backend: Backend, seen: Record, say: Say) -> int:
    rec = store.read(seen.name)  # as written now
    if rec is None or not _unread(rec) or rec.nonce != seen.nonce or rec.last_exit is None:
        return 0
    status = backend.late_exit(rec)
    if status is None or status.code is None:
        return 0
    ended = _known(rec.last_exit, status)
    message = rec.message.replace(str(rec.last_exit), str(ended))
    store.write(replace(rec, last_exit=ended, message=message))
    _tell(say, rec, ended, "its runtime answered")
    return 1


def _read_previous(store: RecordStore, backend: Backend, seen: Record, say: Say) -> int:
    """The run a restart ended unread: its code into the last exit where that is still
    the exit recorded as unknown; the record forgets the run once read, or once nothing
    will ever say its code (its container removed meanwhile)."""
    rec = store.read(seen.name)
    before = None if rec is None else rec.unread_exit
    if rec is None or before is None or before != seen.unread_exit:
        return 0
    status = backend.previous_exit(rec)
    if status is None:
        return 0
    if status.code is None:  # NOT_KEPT: nothing more to read; the code stays unknown
        store.write(replace(rec, unread_exit=None))
        return 0
    ended = _known(before.exit, status)
    last = ended if rec.last_exit == before.exit else rec.last_exit
    message = rec.message.replace(str(before.exit), str(ended))
    store.write(replace(rec, last_exit=last, unread_exit=None, message=message))
    _tell(say, rec, ended, f"its run before the restart (container {before.container.id[:12]})")
    return 1


def _known(unknown: ExitInfo, status: ExitStatus) -> ExitInfo:
    """The exit recorded as unknown, with the code (and OOMKilled) its runtime said."""
    why = OOM_KILLED if status.oom_killed else ""
    return ExitInfo(code=status.code, at=unknown.at, reason=why)


def _tell(say: Say, rec: Record, ended: ExitInfo, whose: str) -> None:
    """The journal's correction of the `code unknown` it said when the engine ended."""
    log.info("engine exit read from its runtime", deployment=rec.name, code=ended.code)
    say(rec.name, ACTION, f"exit code read from the runtime: {whose}", f"engine {ended}",
        exit_code=ended.code, oom_killed=ended.reason == OOM_KILLED)  # fmt: skip


def _unread(rec: Record) -> bool:
    """An ended container engine the record still names, whose exit says no code."""
    ended = rec.last_exit
    return (
        rec.container is not None
        and rec.phase in ENDED
        and ended is not None
        and ended.code is None
        and ended.signal is None
    )
