"""When each manifest set's last pass observed its node: ``<state>/observed.json``.

`status` reads records, which a pass writes only when something changes: a cron pass
from an hour ago still says Ready over an engine killed since. Each pass notes here when
it looked (and whether its folders held no manifest, so it pruned nothing; how many
deployments its labels left to other nodes, and which of those it still runs), so `status`
can say how old its view is, why a removed manifest still runs and what this node does
not run. Written under the pass lock; one entry per (node, owner); a torn or foreign
file is quarantined and reads as no entries.

A pass that sees what the last one saw writes nothing here (as kubelet posts a status
only on change): ``observed.json`` sits in the state dir's top folder, which the gateway
watches for ``drain.json``, so a rewrite every resync woke it every 5 s. Its entries'
``at`` is then when the note last changed; each pass's time goes to
``heartbeat/observed-at.json`` (a folder nobody watches) with the note's ``at`` it
follows, and a reader takes the heartbeat's time while the note is that one: a note
written since (a pass cut short between the two writes, an older reconcile after a
downgrade) is newer than the heartbeat whatever the clock did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.core.manifest.names import base_name
from controller.core.state import Record
from controller.store.documents import Document
from controller.store.statedir import StateDir


@dataclass(frozen=True, slots=True)
class Seen:
    node: str
    owner: str
    at: datetime
    prune_blocked: str | None = None  # the folders held no manifest: nothing was pruned
    skipped: str | None = None  # a fleet: what this node left to others, and why
    kept: str | None = None  # a fleet: what it runs on for a broken manifest of others'
    # Engines serving their old spec, the new one's model pull failing: deployment -> why.
    # Here, not in the record's message, which would outlive a spec changed back.
    held: dict[str, str] = field(default_factory=dict)
    # The files that did not load and name no record (a new file's YAML syntax error): each
    # one's first error, its file and line named as its user names them.
    unloaded: list[str] = field(default_factory=list)


Key = tuple[str, str]  # (node, owner): one entry each
Beat = tuple[datetime, datetime]  # the last pass's time, the note's ``at`` it follows


def _document(state_dir: Path) -> Document[list[Seen]]:
    state = StateDir(state_dir)
    return Document(state, state.observed, _decode, lambda seen: [_encode(s) for s in seen])


def _heartbeat(state_dir: Path) -> Document[dict[Key, Beat]]:
    state = StateDir(state_dir)
    return Document(state, state.observed_at, _decode_times, _encode_times)


def note(state_dir: Path, seen: Seen) -> None:
    """Record ``seen``, replacing that (node, owner)'s previous entry (pass lock held):
    its time always (the heartbeat), the note itself only when it changed."""
    key = (seen.node, seen.owner)
    notes = _document(state_dir).read() or []
    old = next((s for s in notes if (s.node, s.owner) == key), None)
    if old is not None and replace(old, at=seen.at) == seen:
        noted = old.at  # the note stays as it is
    else:  # new, or changed: in its place, so the file's order stays
        noted = seen.at
        fresh = [seen if s is old else s for s in notes]
        _document(state_dir).write(fresh if old is not None else [*notes, seen])
    beats = _heartbeat(state_dir).read() or {}
    _heartbeat(state_dir).write({**beats, key: (seen.at, noted)})


def read_all(state_dir: Path) -> list[Seen]:
    return _beating(_document(state_dir).read() or [], _heartbeat(state_dir).read() or {})


def peek_all(state_dir: Path) -> list[Seen]:
    """``read_all`` for a reader that must change nothing (status, describe, the page): a
    torn or foreign file reads as no entries and stays where it is, for a pass to set aside."""
    return _beating(_document(state_dir).peek() or [], _heartbeat(state_dir).peek() or {})


def _beating(notes: list[Seen], beats: dict[Key, Beat]) -> list[Seen]:
    """Each note at its set's last pass: the heartbeat's time where it follows this very
    note, else the note's own (a heartbeat lost, or a note written since)."""
    return [replace(s, at=_beat_of(s, beats.get((s.node, s.owner)))) for s in notes]


def _beat_of(note: Seen, beat: Beat | None) -> datetime:
    return beat[0] if beat is not None and beat[1] == note.at else note.at


@dataclass
class Views:
    """What the notes say of each record: when its node was last looked at, and what
    holds it as it is (its set's folders held no manifest: nothing pruned; its new spec
    cannot start, so it serves the old one)."""

    seen: dict[str, datetime] = field(default_factory=dict)  # record -> observed at
    conditions: dict[str, list[str]] = field(default_factory=dict)  # record -> conditions
    # record -> its set's condition when the set's last pass read no manifest (its folder
    # gone or empty, at a git source's applied commit): nothing pruned, nothing re-read
    unread: dict[str, str] = field(default_factory=dict)

    def as_read(self, rec: Record) -> Record:
        """``rec`` as its set's last pass left it. A pass that read no manifest kept the
        record whole (invariant 5), so a spec-invalid mark on it is an earlier manifest's:
        the file it names is not at the commit applied; it is not shown as if it were."""
        return rec.unmarked() if rec.name in self.unread else rec


def views(notes: list[Seen], records: Iterable[Record]) -> Views:
    """``notes`` applied to ``records``: every view of the node (status, describe, the
    page) says the same of each."""
    found = Views()
    for rec in records:
        looked = [n for n in notes if _looked_at(n, rec)]
        if looked:
            found.seen[rec.name] = max(n.at for n in looked)
        mine = [n for n in looked if n.owner == rec.owner]
        found.conditions[rec.name] = [n.prune_blocked for n in mine if n.prune_blocked]
        if found.conditions[rec.name]:
            found.unread[rec.name] = found.conditions[rec.name][0]
        found.conditions[rec.name] += [h for n in mine if (h := n.held.get(base_name(rec.name)))]
    return found


def _looked_at(note: Seen, rec: Record) -> bool:
    """Whether the pass ``note`` tells of looked at ``rec``: its own set's pass, as a pass
    judges (and rewrites) only its own set's records; another set's on the same node sees
    the engine only to keep off its lease, so a record written minutes ago by a cron set
    is not as fresh as a daemon's pass of another set. A local record: its set's pass on
    its node. A cluster record's ``node`` is the cluster's node that runs it, never a
    controller's: its set's pass looks at it (through the cluster), whichever host that
    pass ran on."""
    return note.owner == rec.owner and (rec.on_cluster or note.node == rec.node)


def _decode(data: Any) -> list[Seen]:
    if not isinstance(data, list):
        raise TypeError(f"a list of entries, not {type(data).__name__}")
    return [_seen(item) for item in data]


def _seen(item: Any) -> Seen:
    blocked = item.get("prune_blocked")
    return Seen(
        node=str(item["node"]),
        owner=str(item["owner"]),
        at=datetime.fromisoformat(item["at"]),
        prune_blocked=str(blocked) if blocked else None,
        skipped=str(item["skipped"]) if item.get("skipped") else None,
        kept=str(item["kept"]) if item.get("kept") else None,
        held={str(k): str(v) for k, v in (item.get("held") or {}).items()},
        unloaded=[str(e) for e in item.get("unloaded") or []],
    )


def _encode(seen: Seen) -> dict[str, Any]:
    return {
        "node": seen.node,
        "owner": seen.owner,
        "at": seen.at.isoformat(),
        "prune_blocked": seen.prune_blocked,
        **({"skipped": seen.skipped} if seen.skipped else {}),
        **({"kept": seen.kept} if seen.kept else {}),
        **({"held": seen.held} if seen.held else {}),
        **({"unloaded": seen.unloaded} if seen.unloaded else {}),
    }


def _decode_times(data: Any) -> dict[Key, Beat]:
    if not isinstance(data, list):
        raise TypeError(f"a list of entries, not {type(data).__name__}")
    return {
        (str(i["node"]), str(i["owner"])): (
            datetime.fromisoformat(i["at"]),
            datetime.fromisoformat(i["noted"]),
        )
        for i in data
    }


def _encode_times(beats: dict[Key, Beat]) -> list[dict[str, str]]:
    return [
        {"node": n, "owner": o, "at": at.isoformat(), "noted": noted.isoformat()}
        for (n, o), (at, noted) in beats.items()
    ]
