"""Watching state-dir folders: inotify through watchdog, the daemon's way, for any process.

A watch only says "look now": its owner then scans what it watches (level-triggered),
so an event coalesced, dropped (a full kernel queue) or missed while a folder was being
re-armed costs nothing but the wait for the owner's slow resync, its safety net. The
owner arms the watch *before* its first scan, so a file written just before is seen by
the scan and one written after by an event. What wakes it: a file of interest created,
closed after a write, deleted, or renamed into or out of a watched folder (``write_atomic``
renames a hidden tmp file onto the name); never a read (an open and a close without a
write), never a hidden tmp file. An idle state dir wakes nobody.

Folders that do not exist yet are armed by ``rearm()`` (call it on each resync): by
identity, so a folder removed and made again is watched again; an observer thread that
died is replaced. ``Watch`` is that mechanism, the one observer code; ``FolderWatch``
(the state dir's folders) and the daemon's ``ManifestWatch`` only filter its events.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import ObservedWatch
from watchdog.observers.inotify import InotifyObserver

from controller.logsetup import get_logger

log = get_logger("reconcile")


class _UnscheduleRace(logging.Filter):
    """watchdog logs an *error* when a watch we unschedule (``rearm`` moving it onto a
    folder that came back) still had a read in flight: its emitter was already stopped,
    the event is dropped, nothing is wrong. Not an error line in our log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


logging.getLogger("watchdog.observers.inotify").addFilter(_UnscheduleRace())

# What the kernel is asked for (the inotify mask): changes, and no others. A read of any
# file in a watched folder is an open and a close without a write: every one of them
# would wake the watch thread for nothing (a folder above that is read all the time
# overflowed the kernel's queue and starved the daemon once).
WATCHED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


def _observer() -> InotifyObserver:
    """inotify's observer, saying a rename it cannot pair as one: a file renamed in from a
    folder nobody watches (``mv /elsewhere/a.yaml manifests/``) is a move with no source,
    whole as it lands, where watchdog's default made it a creation, a file just begun."""
    observer = InotifyObserver(generate_full_events=True)
    observer.daemon = True
    return observer


def visible(path: Path) -> bool:
    """Not a hidden file: ``write_atomic``'s tmp files, the ballast, an editor's swap."""
    return not path.name.startswith(".")


class _Handler(FileSystemEventHandler):
    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.watch.dispatch(event)


class Watch:
    """One watchdog observer over directories, each armed by identity (a folder removed
    and made again is watched again) and an observer thread that died replaced: the
    mechanism every watch shares. A subclass says which directories (``directories``) and
    what an event means to its owner (``dispatch``, called on watchdog's thread)."""

    def __init__(self, folders: Iterable[Path], what: str) -> None:
        self.folders = tuple(folders)
        self._what = what  # whose watch, in the log line of a dead thread
        self._observer = _observer()
        self._watches: dict[Path, tuple[tuple[int, int], ObservedWatch]] = {}
        self._handler = _Handler(self)
        self._started = False
        self.restarts = 0  # observer threads found dead and replaced

    def start(self) -> None:
        """Arm the watch (before the owner's first scan)."""
        self._observer.start()
        self._started = True
        self.rearm()

    def stop(self) -> None:
        self._started = False
        self._observer.stop()
        with contextlib.suppress(RuntimeError):  # never started
            self._observer.join(timeout=5)

    def dispatch(self, event: FileSystemEvent) -> None:
        raise NotImplementedError

    def directories(self) -> dict[Path, tuple[int, int]]:
        """The directories to watch now, with their identity: each folder that exists."""
        found = {folder: dir_identity(folder) for folder in self.folders}
        return {path: ident for path, ident in found.items() if ident is not None}

    def revive(self) -> bool:
        """Replace a dead observer thread (True if it was dead): events flow again."""
        if not self._started or self._observer.is_alive():
            return False
        self.restarts += 1
        log.error(
            f"{self._what} watch thread died: restarting it (the resync covered meanwhile)",
            restarts=self.restarts,
        )
        self._observer = _observer()
        self._watches.clear()  # they belonged to the dead observer
        self._observer.start()
        return True

    def rearm(self) -> None:
        """Watch what ``directories`` names now, by identity; replace a dead observer."""
        self.revive()
        wanted = self.directories()
        for path, (ident, watch) in list(self._watches.items()):
            if wanted.get(path) != ident:
                with contextlib.suppress(KeyError):
                    self._observer.unschedule(watch)
                del self._watches[path]
        for path, ident in wanted.items():
            if path not in self._watches:
                with contextlib.suppress(OSError):  # gone again, or no inotify left: resync
                    # A folder that is a symlink (`manifests -> releases/v2`) is watched
                    # where it points, as its identity is taken: watchdog's default watches
                    # the link itself, which no change inside the folder ever touches.
                    watch = self._observer.schedule(
                        self._handler,
                        str(path),
                        recursive=False,
                        event_filter=WATCHED_EVENTS,
                        follow_symlink=True,
                    )
                    self._watches[path] = (ident, watch)

    @property
    def watched(self) -> list[Path]:
        return sorted(self._watches)


class FolderWatch(Watch):
    """``on_change()`` (called on watchdog's thread) whenever a file of ``folders`` that
    ``wanted`` accepts changed."""

    def __init__(
        self,
        folders: Iterable[Path],
        on_change: Callable[[], None],
        wanted: Callable[[Path], bool] = visible,
    ) -> None:
        super().__init__(folders, "state dir")
        self.on_change = on_change
        self.wanted = wanted

    def dispatch(self, event: FileSystemEvent) -> None:
        if self.concerns(event):
            self.on_change()

    def concerns(self, event: FileSystemEvent) -> bool:
        for raw in (event.src_path, event.dest_path):
            path = Path(os.fsdecode(raw)) if raw else None
            if path is not None and path.parent in self.folders and self.wanted(path):
                return True
            if path in self.folders:  # a watched folder itself came or went
                return True
        return False


def dir_identity(path: Path) -> tuple[int, int] | None:
    """A directory's (device, inode), None if it is not one now."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if os.path.isdir(path) else None
