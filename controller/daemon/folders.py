"""Folder events: a watchdog observer on each manifests folder and on its parent.

Events only say "look now" (passes are level-triggered), so the filter is loose
but cheap: a ``*.yaml``/``*.yml`` file that is not hidden was created, written,
deleted or moved (an editor's atomic save is a rename onto the name), or the
folder itself (or a folder above it) came or went. The parent's watch sees a
folder that disappears and comes back; ``rearm()`` before each pass moves the
folder's own watch onto whatever directory now has its path, and restarts the
observer if its thread died (watchdog 3 died on the first event without a
``dest_path``; any bug there would otherwise leave only the resync, silently).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import (
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import ObservedWatch

from controller.logsetup import get_logger
from controller.store.manifests import SUFFIXES, is_single_file

# The kernel's mask, shared with the gateway's watch; importing it filters watchdog's
# harmless unschedule-race error line too.
from controller.store.watch import WATCHED_EVENTS

log = get_logger("reconcile")


CHANGES = frozenset({"created", "modified", "deleted", "moved", "closed"})
COMINGS_AND_GOINGS = frozenset({"created", "deleted", "moved"})
# What each event says of its file (see timers.Settling): closed after a write, or renamed
# into place, it is whole; created or modified, still being written; deleted (or renamed
# away), gone. A folder itself coming or going waits like a deletion.
KIND = {"closed": "settled", "moved": "settled", "created": "writing", "modified": "writing"}


def is_manifest_name(name: str) -> bool:
    """The rule of :func:`controller.store.manifests.manifest_files`: skip hidden, temp files."""
    return not name.startswith(".") and name.endswith(SUFFIXES)


class _Handler(FileSystemEventHandler):
    def __init__(self, watch: FolderWatch) -> None:
        self.watch = watch

    def on_any_event(self, event: FileSystemEvent) -> None:
        for kind, path in self.watch.changes(event):
            self.watch.on_change(kind, path)


class FolderWatch:
    def __init__(self, folders: Iterable[Path], on_change: Callable[[str, str], None]) -> None:
        self.folders = tuple(folders)
        self.on_change = on_change
        # `-f FILE`: a manifest named itself; its folder is watched for it alone.
        self._files = {f for f in self.folders if is_single_file(f)}
        self._above = {a for f in self.folders for a in f.parents} | set(self.folders)
        self._observer = Observer()
        self._observer.daemon = True
        self._watches: dict[Path, tuple[tuple[int, int], ObservedWatch]] = {}
        self._handler = _Handler(self)
        self._started = False
        self.restarts = 0  # observer threads found dead and replaced

    def start(self) -> None:
        self._observer.start()
        self._started = True
        self.rearm()

    def stop(self) -> None:
        self._started = False
        self._observer.stop()
        self._observer.join(timeout=5)

    def revive(self) -> bool:
        """Replace a dead observer thread (True if it was dead): events flow again."""
        if not self._started or self._observer.is_alive():
            return False
        self.restarts += 1
        log.error(
            "folder watch thread died: restarting it (passes ran on the resync meanwhile)",
            restarts=self.restarts,
        )
        self._observer = Observer()
        self._observer.daemon = True
        self._watches.clear()  # they belonged to the dead observer
        self._observer.start()
        return True

    def changes(self, event: FileSystemEvent) -> list[tuple[str, str]]:
        """(kind, path) for each manifest or watched folder the event concerns."""
        if event.event_type not in CHANGES:
            return []  # opened / closed_no_write: our own passes read the files
        out: list[tuple[str, str]] = []
        for side, raw in (("src", event.src_path), ("dest", event.dest_path)):
            path = Path(os.fsdecode(raw)) if raw else None
            if path is None:
                continue
            named = path in self._files  # `-f FILE`
            if named or (path.parent in self.folders and is_manifest_name(path.name)):
                gone = event.event_type == "deleted" or (
                    event.event_type == "moved" and side == "src"
                )
                out.append(("deleted" if gone else KIND[event.event_type], str(path)))
            elif path in self._above and event.event_type in COMINGS_AND_GOINGS:
                out.append(("deleted", str(path)))  # a folder came or went: wait it out
        return out

    def rearm(self) -> None:
        """Watch each folder that exists (by identity) and the nearest directory above it."""
        self.revive()
        wanted: dict[Path, tuple[int, int]] = {}
        for folder in self.folders:
            for path in (folder, *folder.parents):
                ident = _identity(path)
                if ident is not None:
                    wanted[path] = ident
                    if path != folder:
                        break  # the nearest directory above that exists
        for path, (ident, watch) in list(self._watches.items()):
            if wanted.get(path) != ident:
                with contextlib.suppress(KeyError):
                    self._observer.unschedule(watch)
                del self._watches[path]
        for path, ident in wanted.items():
            if path not in self._watches:
                with contextlib.suppress(OSError):  # gone again meanwhile: next rearm
                    watch = self._observer.schedule(
                        self._handler, str(path), recursive=False, event_filter=WATCHED_EVENTS
                    )
                    self._watches[path] = (ident, watch)

    @property
    def watched(self) -> list[Path]:
        return sorted(self._watches)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if os.path.isdir(path) else None
