"""Watching state-dir folders (store/watch.py): inotify through watchdog, as the daemon
watches its manifests. What must wake the owner does: a document written atomically, a
file renamed in from elsewhere, one removed, a folder that came after the start (once
re-armed); hidden tmp files, names the owner does not want and subfolders are refused."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.store.documents import write_atomic
from controller.store.watch import FolderWatch, visible

WAIT = 30.0  # seconds: generous under load; each wait ends on the event


class Woken:
    """The watch's calls, counted; ``next()`` waits for one after the last it saw."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()
        self.seen = 0

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def next(self, what: str) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.count > self.seen, WAIT), what
            self.seen = self.count


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "instances").mkdir()
    return tmp_path / "instances"


@pytest.fixture
def woken(folder: Path) -> Iterator[tuple[FolderWatch, Woken]]:
    calls = Woken()
    watch = FolderWatch(
        (folder, folder.parent / "later"),
        calls,
        wanted=lambda p: visible(p) and p.suffix == ".json",
    )
    watch.start()
    try:
        yield watch, calls
    finally:
        watch.stop()


def test_an_atomic_write_a_rename_in_and_a_removal_each_wake(
    folder: Path, woken: tuple[FolderWatch, Woken]
) -> None:
    _, calls = woken
    write_atomic(folder / "web.json", b"{}")  # tmp (hidden) + rename onto the name
    calls.next("an atomic write")
    outside = folder.parent / "elsewhere.json"
    outside.write_text("{}")
    os.rename(outside, folder / "api.json")  # moved in from an unwatched folder
    calls.next("a rename into the folder")
    (folder / "web.json").unlink()
    calls.next("a removal")


def test_tmp_files_acks_and_subfolders_are_refused_a_document_wakes(
    folder: Path, woken: tuple[FolderWatch, Woken]
) -> None:
    watch, calls = woken
    # Decided by the filter, not by timing: each of these events is refused.
    for path in (folder / ".web.json.1.2.tmp", folder / "web.done", folder / "logs" / "w.json"):
        assert not watch.concerns(_Event(path)), path  # type: ignore[arg-type]
    assert watch.concerns(_Event(folder / "web.json"))  # type: ignore[arg-type]
    (folder / "web.done").write_text("")
    write_atomic(folder / "web.json", b"{}")
    calls.next("the document after the ack")


def test_a_folder_made_after_the_start_is_watched_once_rearmed(
    folder: Path, woken: tuple[FolderWatch, Woken]
) -> None:
    watch, calls = woken
    later = folder.parent / "later"
    assert watch.watched == [folder]
    later.mkdir()
    watch.rearm()  # what the owner's resync does
    assert watch.watched == sorted([folder, later])
    write_atomic(later / "x.json", b"{}")
    calls.next("a write in the folder made later")


class _Event:
    """A watchdog event's two fields that ``concerns`` reads."""

    def __init__(self, path: Path) -> None:
        self.src_path = str(path)
        self.dest_path = ""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_observer_is_restarted_counted_and_events_flow_again(
    folder: Path, woken: tuple[FolderWatch, Woken]
) -> None:
    """The state dir's watch shares the daemon's observer code (store/watch.py's Watch): a
    thread a bug killed is replaced at the next rearm, counted, and wakes the owner again."""
    watch, calls = woken
    real = watch.concerns

    def broken(event: object) -> bool:
        raise AttributeError("'FileModifiedEvent' object has no attribute 'dest_path'")

    watch.concerns = broken  # type: ignore[method-assign,assignment]
    write_atomic(folder / "web.json", b"{}")
    watch._observer.join(WAIT)  # the event killed it
    assert not watch._observer.is_alive(), "the observer thread to die"
    watch.concerns = real  # type: ignore[method-assign]
    watch.rearm()  # what the owner's resync does
    assert watch.restarts == 1 and watch.watched == [folder]
    write_atomic(folder / "api.json", b"{}")
    calls.next("a write seen by the new observer")
