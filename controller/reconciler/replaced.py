"""A pass on a state dir that is not its engines': refused, nothing changed.

An engine carries its state dir's path and id (``store/config/stateid.py``). One that
carries this path and another id was started by another state dir at this path: this
folder is the empty mount point of a disk not mounted, or was emptied or replaced (or
did not exist: a cron `--once` made it), and has no record of it. Invariant 3 (no
engine survives without a record) is each state dir's own: such an engine is not this
one's to adopt or kill. A pass that took them for its own strays stopped every engine of
the node (and started each anew: minutes of weight loading), and the old state dir, once
mounted again, held records of engines then dead. So no pass acts while one runs; it
says which, why, and the moves: put the state dir back, or stop them on purpose
(``reconcile down`` of their manifest set, which stops them as its own strays).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from controller.backends.base import Backend
from controller.core.plan import leader_of
from controller.core.state import MarkedProcess
from controller.errors import StateDirReplaced

# A reap's reason for one (`reconcile down`, the explicit way to start afresh).
REAPED = "are of another state dir at this path (its disk not mounted, or replaced)"


def refuse_beside_strangers(backend: Backend, state_dir: Path, owner: str) -> None:
    """StateDirReplaced, saying why, while an engine of another state dir at this path
    runs (``Backend.strangers``)."""
    found = backend.strangers()
    if found:
        raise StateDirReplaced(said(state_dir, found, owner))


def said(state_dir: Path, found: Sequence[MarkedProcess], owner: str) -> str:
    """The refusal, for people: the dir, the engines (and model pulls), why, and the moves."""
    engines = _engines([m for m in found if m.pull is None])
    pulls = _engines([m for m in found if m.pull is not None])  # one per cache key
    listed = ", ".join([*(_named(m, owner) for m in engines), *map(_pull_named, pulls)])
    counted = [f"{len(engines)} engine(s)"] if engines else []
    counted += [f"{len(pulls)} model pull(s)"] if pulls else []
    return (
        f"state dir {state_dir} is not the one its engines were started with: "
        f"{' and '.join(counted)} marked with its path run with another state dir's id "
        f"({listed}). Its disk may not be mounted, or the folder was emptied or replaced: "
        "it has no record of them. Nothing was changed and they run on. Mount its disk (or "
        "put the folder back) and run again: the next pass takes them up. To start afresh "
        "on this one on purpose, `reconcile down` of their manifest set on this state dir "
        f"stops them; then run again{_PULLS if pulls else ''}"
    )


# A pull writes its files into the cache and its events into the journal at this path
# (this folder's, were it another state dir's): no `down` stops one, it ends by itself.
_PULLS = (
    ". A model pull is stopped by no `down`: it ends by itself, writing into this folder "
    "meanwhile; wait for it, or end its pid by hand (its partial file is kept to resume)"
)


def _engines(found: Sequence[MarkedProcess]) -> list[MarkedProcess]:
    """One process per engine (its leader), by name; per model pull too (its nonce)."""
    groups: dict[str, list[MarkedProcess]] = {}
    for marked in found:
        groups.setdefault(marked.nonce, []).append(marked)
    leaders = [leader_of(procs) or procs[0] for procs in groups.values()]
    return sorted(leaders, key=lambda m: (m.name, m.ref.pid))


def _pull_named(marked: MarkedProcess) -> str:
    """``the model pull for web pid 123``."""
    return f"the model pull for {marked.name} pid {marked.ref.pid}"


def _named(marked: MarkedProcess, owner: str) -> str:
    """``web pid 123``; another manifest set's says which (its own `down` stops it)."""
    theirs = "" if marked.owner in (None, owner) else f" of manifest set {marked.owner!r}"
    return f"{marked.name} pid {marked.ref.pid}{theirs}"
