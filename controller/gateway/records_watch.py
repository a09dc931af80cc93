"""The gateway process's view of the records: ``<state>/instances/``, re-read on change.

A look is one ``scandir`` of the folder and a stat of each record (name, inode, mtime in
ns, size; no read), taken when the folder's watch (``store/watch.py``, inotify) says it
changed, on a request for a name the table lacks, and every ``RESYNC`` seconds as the
safety net (an idle box wakes nothing else). Records are written tmp + rename, so a new version
is a new inode, but two writes between looks can hand the record its old inode back
(the first rename freed it, the second tmp file took it): the page once missed an engine
going Idle that way, so the mtime and size count too. Only on a change are the records
read (in a thread), so a request never touches the disk.

Records are read as a read verb reads them (``RecordStore.peek``). Read-only: a record
this gateway cannot parse (torn, foreign, or written by a newer reconcile during an
upgrade) keeps its last good reading for routing (its engine serves on), is named in
``problems`` as `status` names it (the page shows it), and is never quarantined (that is
the daemon's call). Records are those of the daemon's owner and node, as a pass's
``ours()`` gives them.

The node's drain (``drain.json``) is read with them, its version part of the stamp: a
request for a deployment the drain keeps from starting is answered at once.

A folder at the path that is another state dir than the one the records were read in (its
id, ``store/config/stateid.py``, not that one's) and holds no record is a disk not
mounted, or the folder emptied or replaced: its engines run on (passes refuse to act
beside them), so the last reading stays, as for a folder gone, and routes on to them
until their state dir is back or a pass writes records there.
"""

from __future__ import annotations

import os
from pathlib import Path

from controller.core.manifest.names import base_name
from controller.core.state import Drain, Record
from controller.errors import ConfigError
from controller.store.config import stateid
from controller.store.config.node import read_drain
from controller.store.instances.records import RecordProblem, RecordStore
from controller.store.statedir import StateDir

# Seconds between looks when no watch event came: the safety net, and the port's guard's
# period (process.GUARD_PERIOD), which no file event can stand in for.
RESYNC = 5.0

Stamp = frozenset[tuple[str, int, int, int]]
DRAIN = "/drain"  # the drain file's entry in a stamp: no record's file name has a slash


class RecordsWatch:
    def __init__(self, state_dir: Path, owner: str, node: str) -> None:
        self.store = RecordStore(state_dir)
        self.instances = self.store.instances
        self.state_dir = state_dir
        self.drain_path = StateDir(state_dir).drain
        self.drain: Drain | None = None  # the node's drain, as the last ``read`` found it
        self.owner = owner
        self.node = node
        self.seen: Stamp | None = None
        self._good: dict[str, Record] = {}  # name -> its last good reading
        self.problems: list[RecordProblem] = []  # the last read's unreadable records
        self.read_in: str | None = None  # the id of the state dir the last read was of

    def stamp(self) -> Stamp | None:
        """What the folder holds now (name, inode, mtime, size); None when it is gone, or
        another state dir's with no record (the module's docstring)."""
        found = self._stamp()
        return None if found is not None and self._elsewhere(found) else found

    def _elsewhere(self, found: Stamp) -> bool:
        if self.read_in is None or any(entry[0] != DRAIN for entry in found):
            return False
        return _state_id(self.state_dir) != self.read_in

    def _stamp(self) -> Stamp | None:
        try:
            with os.scandir(self.instances) as entries:
                return frozenset(
                    [
                        *(
                            _version(e)
                            for e in entries
                            if e.name.endswith(".json") and not e.name.startswith(".")
                        ),
                        _drain_version(self.drain_path),
                    ]
                )
        except FileNotFoundError:
            return None
        except OSError:
            return self.seen  # unreadable for a moment: keep what we know

    def changed(self) -> Stamp | None:
        """The new stamp if the folder changed since the last ``read``, else None."""
        now = self.stamp()
        return now if now is not None and now != self.seen else None

    def read(self, stamp: Stamp) -> list[Record]:
        """Every record of ours in the folder (call it off the event loop)."""
        snap = self.store.peek()
        fresh = dict(snap.records)
        for problem in snap.problems:  # unreadable now: its last good reading stays
            good = self._good.get(problem.name or "")
            if good is not None:
                fresh[good.name] = good
        self._good = fresh
        self.problems = list(snap.problems)
        self.drain = _read_drain(self.state_dir)
        self.seen = stamp
        self.read_in = _state_id(self.state_dir)
        return [r for r in fresh.values() if r.owner == self.owner and not r.elsewhere(self.node)]

    def newer(self) -> frozenset[str]:
        """The deployments of the last ``read``'s records of an unknown version (a newer
        reconcile's: a downgrade) that have no last good reading to route by."""
        return frozenset(
            base_name(p.name)
            for p in self.problems
            if p.kept and p.name and p.name not in self._good
        )

    def record(self, name: str) -> Record | None:
        return self._good.get(name)

    def everything(self) -> list[Record]:
        """Every record of the last ``read``, whoever owns it (the web page shows them
        all, as ``status`` does)."""
        return list(self._good.values())


def _version(entry: os.DirEntry[str]) -> tuple[str, int, int, int]:
    try:
        st = entry.stat()
    except FileNotFoundError:  # renamed over or removed since the scandir: next look
        return (entry.name, entry.inode(), 0, -1)
    return (entry.name, st.st_ino, st.st_mtime_ns, st.st_size)


def _drain_version(path: Path) -> tuple[str, int, int, int]:
    try:
        st = os.stat(path)
    except OSError:  # none (the usual), or unreadable: no drain the gateway can tell of
        return (DRAIN, 0, 0, -1)
    return (DRAIN, st.st_ino, st.st_mtime_ns, st.st_size)


def _read_drain(state_dir: Path) -> Drain | None:
    """The drain, None when there is none or it cannot be read (the daemon says so; a
    request then waits its readiness deadline, as it did before the gateway read it)."""
    try:
        return read_drain(state_dir)
    except (ConfigError, OSError):
        return None


def _state_id(state_dir: Path) -> str | None:
    """The id of the state dir at the path (None: none, or none this user may trust)."""
    try:
        return stateid.peek(state_dir)
    except (ConfigError, OSError):
        return None
