"""Engines running with no record, found by their spawn notes (store/instances/spawnnotes.py).

A pass names such an engine (`--once`'s warning, its journal), and `devices` shows what it
holds; `status` and `describe` said nothing of it, though it holds this node's port and
devices. They point to it in one line each: reading only, no scan (a note's process is
judged by its identity, invariant 6), nothing signalled or removed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from controller.core.manifest import backendnames
from controller.core.manifest.names import base_name
from controller.core.state import Record
from controller.host.procs import process_alive
from controller.store.config.node import Config
from controller.store.instances.spawnnotes import SpawnNotes
from controller.store.statedir import StateDir

MARKER = "RECONCILE_INSTANCE"  # <node>/<name>/<nonce>, as the runtime sets it


@dataclass(frozen=True, slots=True)
class Unrecorded:
    name: str  # the instance its marker names
    pid: int
    port: str | None
    note: Path

    def line(self) -> str:
        """One line: what runs, what it holds, and where to look next."""
        holds = f" holds port {self.port}" if self.port else " runs"
        return (
            f"{self.name}: engine pid {self.pid}{holds} with no record: its spawn note "
            f"{self.note} names it; `reconcile devices` shows what it holds, and "
            f"`reconcile events {self.name}` what the passes said of it"
        )


def unrecorded(state_dir: Path, recorded: Collection[str]) -> list[Unrecorded]:
    """The live engines whose spawn note's nonce no record (of ``recorded`` nonces) holds."""
    folder = StateDir(state_dir).spawn_notes
    if not folder.is_dir():
        return []
    out = []
    for note in SpawnNotes(state_dir).read_all():
        if note.nonce in recorded or not process_alive(note.ref):
            continue
        _node, _, rest = note.env.get(MARKER, "").partition("/")
        name = rest.rpartition("/")[0] or note.nonce
        path = folder / f"{note.nonce}.json"
        out.append(Unrecorded(name, note.ref.pid, note.env.get("PORT"), path))
    return sorted(out, key=lambda u: (u.name, u.pid))


def said(
    state_dir: Path,
    records: Iterable[Record],
    torn: Collection[str | None],
    names: Collection[str] = (),
) -> list[str]:
    """``warning:`` lines of the engines no record of ``records`` (all that were read)
    holds, those of deployments ``names`` only when given (the notes read once for them
    all); a torn record's (``torn``: their names) is said by its error already."""
    recorded = {r.nonce for r in records if r.nonce}
    found = [u for u in unrecorded(state_dir, recorded) if u.name not in torn]
    wanted = set(names)
    return [
        f"warning: {u.line()}"
        for u in found
        if not wanted or u.name in wanted or base_name(u.name) in wanted
    ]


def of_another_state_dir(cfg: Config) -> list[str]:
    """A ``warning:`` line where engines of another state dir at this path run, beside
    which a pass refuses to act (``reconciler/replaced.py``). A /proc scan: made only
    where no record is (such a state dir has none), for engines on this host."""
    if cfg.backend != backendnames.LOCAL:
        return []
    from controller.backends.choose import open_backend
    from controller.reconciler import replaced

    found = open_backend(cfg).strangers()
    if not found:
        return []
    return [f"warning: passes refuse to act: {replaced.said(cfg.state_dir, found, cfg.owner)}"]
