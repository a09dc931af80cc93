"""A container engine's exit its pass could not read then, read once its runtime answers.

An engine that ended while docker's daemon was down (its `run` lost its stream: no code)
is judged by the pass that sees it dead: `exited (code unknown: ...)`, its container's
removal refused. The container stays (no `--rm`), its State keeping the code; its exit
file says it is still to remove. A later pass, the runtime answering, reads that State
into the record's last exit (and its message), as kubelet reads a container's last
state after its runtime restarts, and removes the container.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from controller.backends.base import Backend
from controller.core.state import OOM_KILLED, ExitInfo, Phase, Record
from controller.logsetup import get_logger
from controller.store.instances.records import RecordStore

log = get_logger("reconcile")

# Where a record keeps the exit of the engine it still names (no restart since).
ENDED = (Phase.FAILED, Phase.BACKOFF, Phase.SUCCEEDED)


def read_late(store: RecordStore, backend: Backend, records: Iterable[Record]) -> int:
    """Fill in the last exit of each record in ``records`` (the pass's view; each read
    again before it is written) whose engine's code was unknown and whose runtime says it
    now; how many. The pass lock is held."""
    filled = 0
    for seen in records:
        rec = store.read(seen.name) if _unread(seen) else None  # as written now
        if rec is None or not _unread(rec) or rec.nonce != seen.nonce:
            continue
        status = backend.late_exit(rec)
        if status is None or status.code is None or rec.last_exit is None:
            continue
        why = OOM_KILLED if status.oom_killed else ""
        ended = ExitInfo(code=status.code, at=rec.last_exit.at, reason=why)
        message = rec.message.replace(str(rec.last_exit), str(ended))
        store.write(replace(rec, last_exit=ended, message=message))
        log.info("engine exit read from its runtime", deployment=rec.name, code=status.code)
        filled += 1
    return filled


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
