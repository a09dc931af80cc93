"""Folder events: a watchdog observer on each manifests folder and on its parent.

Events only say "look now" (passes are level-triggered), so the filter is loose
but cheap: a ``*.yaml``/``*.yml`` file that is not hidden was created, written,
deleted or moved (an editor's atomic save is a rename onto the name), its ``..data``
link renamed onto (a ConfigMap's volume, updated by kubelet), or the folder itself
(or a folder above it) came or went. The parent's watch sees a folder that
disappears and comes back; ``rearm()`` before each pass moves the folder's own
watch onto whatever directory now has its path, and restarts the observer if its
thread died (watchdog 3 died on the first event without a ``dest_path``; any bug
there would otherwise leave only the resync, silently). The observer itself is
``store.watch.Watch``; this module only says what an event means.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent

from controller.store.sources.manifests import SUFFIXES, is_single_file, manifest_files

# The one observer mechanism (and the kernel's mask), shared with the gateway's watch.
from controller.store.watch import Watch, dir_identity

CHANGES = frozenset({"created", "modified", "deleted", "moved", "closed"})
COMINGS_AND_GOINGS = frozenset({"created", "deleted", "moved"})
# What each event says of its file (see timers.Settling): closed after a write, or renamed
# into place (from this folder or from one nobody watches: store/watch.py), it is whole;
# created, begun; modified, being written (no pass reads it before its close); deleted
# (or renamed away), gone. A folder itself coming or going waits like a deletion.
KIND = {"closed": "settled", "moved": "settled", "created": "begun", "modified": "writing"}
# kubelet's atomic writer (a ConfigMap's volume): each file of the folder is a link through
# ``..data``, and an update renames a new ``..data`` (to a new timestamped folder) onto it,
# so no event names a manifest. The rename lands whole.
SWAPPED = "..data"


# What a pass compares of each manifest before it applies what it read: (inode, size,
# mtime_ns, ctime_ns). A write, truncate or rename changes one of them; ctime no writer sets.
Stamp = tuple[int, int, int, int]


def stamps(folders: Iterable[Path]) -> dict[str, Stamp]:
    """Each manifest file of ``folders`` (as ``manifests.load`` lists them) by its path,
    with its stamp: what a pass's read of the folders may have been torn by, when two
    differ. A folder or file that cannot be read has none (its pass says why)."""
    out: dict[str, Stamp] = {}
    for folder in folders:
        try:
            files = [folder] if is_single_file(folder) else manifest_files(folder)
        except OSError:
            continue
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            out[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def is_manifest_name(name: str) -> bool:
    """The rule of :func:`controller.store.sources.manifests.manifest_files`: skip hidden,
    temp files."""
    return not name.startswith(".") and name.endswith(SUFFIXES)


class ManifestWatch(Watch):
    """``on_change(kind, path)`` (called on watchdog's thread) for each manifest or
    watched folder an event concerns; the folders' parents are watched too."""

    def __init__(self, folders: Iterable[Path], on_change: Callable[[str, str], None]) -> None:
        super().__init__(folders, "manifest folder")
        self.on_change = on_change
        # `-f FILE`: a manifest named itself; its folder is watched for it alone.
        self._files = {f for f in self.folders if is_single_file(f)}
        self._above = {a for f in self.folders for a in f.parents} | set(self.folders)

    def dispatch(self, event: FileSystemEvent) -> None:
        for kind, path in self.changes(event):
            self.on_change(kind, path)

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
            elif path.parent in self.folders and path.name == SWAPPED and side == "dest":
                out.append(("settled", str(path)))  # every file's content, switched at once
            elif path in self._above and event.event_type in COMINGS_AND_GOINGS:
                out.append(("deleted", str(path)))  # a folder came or went: wait it out
        return out

    def directories(self) -> dict[Path, tuple[int, int]]:
        """Each folder that exists (by identity), the nearest directory above it, and the
        directory of each symlink above it: a link on the way (git-sync's `current ->
        .worktrees/abc`, switched by a rename) moves the folder, and only its own
        directory hears of the switch (then the pass's ``rearm`` follows the folder)."""
        wanted: dict[Path, tuple[int, int]] = {}
        for folder in self.folders:
            for path in (folder, *folder.parents):
                ident = dir_identity(path)
                if ident is not None:
                    wanted[path] = ident
                    if path != folder:
                        break  # the nearest directory above that exists
            for link in (p for p in folder.parents if p.is_symlink()):
                if (ident := dir_identity(link.parent)) is not None:
                    wanted[link.parent] = ident
        return wanted
