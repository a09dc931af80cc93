"""The state `reconcile source` shows (DESIGN.md "Following git"), worked out from
``source.json`` and the phases of the source's records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from controller.store.sources.git.status import INVALID_KEPT, NOTHING_READ, SourceStatus

if TYPE_CHECKING:
    from controller.core.state import Record

# States of `reconcile source` (DESIGN.md "Following git").
SYNCED, PROGRESSING, DEGRADED = "Synced", "Progressing", "Degraded"
PULL_FAILED, PINNED, UNVERIFIED = "PullFailed", "Pinned", "Unverified"
STATES = (SYNCED, PROGRESSING, DEGRADED, PULL_FAILED, PINNED, UNVERIFIED)
FAILING = frozenset({PULL_FAILED, DEGRADED, UNVERIFIED})  # `--once` exits 1


Phases = Sequence[tuple[str, str]]  # each record of the source: (its name, its phase)
DEGRADING = ("Failed", "BackOff", "Pending")  # a record in one of these makes it Degraded


def degraded(phases: Phases) -> list[str]:
    """The records that make the source Degraded, by name (a notification names them)."""
    return [name for name, phase in phases if phase in DEGRADING]


def phases_of(records: Iterable[Record], owner: str | None = None) -> list[tuple[str, str]]:
    """``state_of``'s phases: each record's (name, phase), of ``owner``'s alone if given."""
    return [(r.name, str(r.phase)) for r in records if owner is None or r.owner == owner]


def state_of(st: SourceStatus, phases: Phases) -> tuple[str, str]:
    """(state, message) from the status and the phases of the source's records."""
    if st.fetch_error:
        since = st.last_fetch_at or "never"
        return PULL_FAILED, f"{st.fetch_error} (last successful fetch: {since})"
    if st.stuck_move:
        running = st.applied[:12] if st.applied else "nothing of the source"
        return PULL_FAILED, f"{st.stuck_move} (still running {running}; nothing pruned)"
    if st.unverified:
        running = st.applied[:12] if st.applied else "nothing"
        return UNVERIFIED, f"{st.unverified} (still running {running})"
    if st.pinned:
        moved = st.fetched and st.fetched != st.pinned
        by = "auto-rollback" if st.auto_pinned else "rollback"
        behind = f"; the branch is at {st.fetched[:12]}" if moved and st.fetched else ""
        return PINNED, f"pinned at {st.pinned[:12]} by {by} (reconcile rollback --resume){behind}"
    if st.fetched is None:
        began = f" (the first fetch began {st.last_try_at})" if st.last_try_at else ""
        return PROGRESSING, f"not fetched yet{began}"
    if st.applied != st.fetched:
        return PROGRESSING, f"applying {st.fetched[:12]}"
    if st.passed_at != st.applied:  # moved, its pass not ended: its records may be unwritten
        return PROGRESSING, f"applying {(st.applied or '-')[:12]}"
    if st.invalid and st.invalid_at == st.applied:
        more = len(st.invalid) - 1
        full = len(st.invalid) >= INVALID_KEPT  # kept no more: there may be others
        rest = f" (and {more}{'+' if full else ''} more)" if more else ""
        return DEGRADED, (
            f"the manifests at {st.applied[:12]} cannot all be applied: {st.invalid[0]}{rest}; "
            f"what they declared before runs on unchanged: {_next_move(st)}"
        )
    bad = [f"{name} {phase}" for name, phase in phases if phase in DEGRADING]
    if bad:
        return DEGRADED, f"{len(bad)} of {len(phases)} deployment(s) not Ready ({', '.join(bad)})"
    waiting = [p for _, p in phases if p not in ("Ready", "Idle")]
    if waiting:
        return PROGRESSING, f"{len(phases) - len(waiting)}/{len(phases)} deployment(s) Ready"
    return SYNCED, f"{len(phases)} deployment(s) Ready at {st.applied[:12]}"


def _next_move(st: SourceStatus) -> str:
    """Where the first error's fix is: a file on this node (an envFrom file's mode, the
    node's age key) wants no push, and a push would change nothing; `validate` reads no
    envFrom file, so it is not offered for those."""
    if st.invalid_on_node:
        return "fix it on this node, as it says (nothing to push: the next pass reads it again)"
    return "fix it and push (`reconcile validate` lists every error)"


def folder_unread(st: SourceStatus) -> str | None:
    """What ``note_invalid`` said first of the applied commit's folder (gone, or holding
    no manifest: its pass read none and pruned nothing); None when it said nothing of it."""
    if not st.invalid or st.invalid_at != st.applied:
        return None
    first = st.invalid[0]
    return first if first.startswith(f"{st.path}: ") and first.endswith(NOTHING_READ) else None


def as_json(st: SourceStatus, state: str, message: str) -> dict[str, Any]:
    return {
        "url": st.url,
        **({"tag": st.tag} if st.tag else {"branch": st.branch}),
        "path": st.path,
        "fetched": st.fetched,
        "applied": st.applied,
        "state": state,
        "message": message,
        "last_fetch_at": st.last_fetch_at,
        "last_applied_at": st.last_applied_at,
        "pinned": st.pinned,
    }
