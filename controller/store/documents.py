"""The state dir's JSON documents: written atomically, read with one policy for a bad file.

Every file the state dir holds is written tmp -> fsync -> rename -> fsync(dir)
(:func:`write_atomic`), so a reader sees a whole version or none. A file that still does
not decode (torn by a disk that lied, hand-edited, written by something else) is moved to
``quarantine/`` with the reason beside it and named in a warning event, never guessed at,
and the reader goes on as if it were absent: records (``records.py``) and every side
document alike. Only a pass sets a file aside: a reader that must change nothing
(`status`, `describe`, `devices`, `plan`, the page) peeks (:func:`peek_document`,
``Document.peek``, ``Folder.read_all(peek=True)``): the file is named and left where it
is. A document of a *newer* version is left in place and named instead (the reconcile
that wrote it may come back), as a record of an unknown version is.

:class:`Document` is one file (``devices/health.json``, ``observed.json``) with a locked
read-modify-write; :class:`Folder` is a folder of them, one per name (``activation/``,
``restart/``, ``scale/``, ``inflight/``). A store is a codec on top: ``decode`` raises
``ValueError`` (or ``KeyError``, ``TypeError``, ``AttributeError``) for a document that is
not one, ``OtherVersion`` for one it cannot read yet.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from controller import failpoints
from controller.core.manifest.names import is_dns1123
from controller.errors import RecordError
from controller.logsetup import get_logger
from controller.store import diskspace, sidefiles
from controller.store.lock import FileLock, pid_alive
from controller.store.statedir import StateDir, lock_beside

log = get_logger("reconcile")

T = TypeVar("T")
LOCK_WAIT = 10.0  # seconds: a locked update is a read and a write
NOT_OURS = (ValueError, KeyError, TypeError, AttributeError)  # what a bad document raises


class OtherVersion(ValueError):
    """A document of a version this reconcile does not read: left in place, named."""


def check_version(data: Any, version: int) -> None:
    """``data`` is an object of ``version``: a newer one is OtherVersion, anything else
    ValueError (quarantined)."""
    found = data.get("version") if isinstance(data, dict) else None
    if isinstance(found, int) and not isinstance(found, bool) and found > version:
        raise OtherVersion(f"version {found}; this reconcile reads version {version}")
    if found != version:
        raise ValueError(f"version {found!r}, not {version}")


# -- writing -------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    # Unique per writer thread too (the gateway writes from a pool); the pid stays the
    # last field before ".tmp": sweep_tmp reads it to find a dead writer's leftovers.
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.{os.getpid()}.tmp")
    try:
        _write_once_more_when_full(tmp, path, data, mode)
    except OSError as exc:
        if exc.errno is None:
            raise
        # A write on a descriptor names no file: "No space left on device" alone does
        # not say which disk (the daemon's `pass failed`, the CLI's I/O error show this);
        # an open names our hidden tmp file (a folder made immutable): the file meant.
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    try:
        failpoints.hit("records.write.before_rename")
        os.replace(tmp, path)
    except OSError as exc:  # a folder in its place: the file meant, not our tmp file
        with contextlib.suppress(OSError):
            tmp.unlink()
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    failpoints.hit("records.write.before_dir_fsync")
    fsync_dir(path.parent)


# A file system without hard links (some FUSE, vfat): write_new cannot link its tmp file in.
NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


def write_new(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """``write_atomic`` only where no file is; False (nothing written) where a writer put one
    first. The tmp file is linked in, not renamed: a link never replaces, so a value made
    from what a reader saw (a torn activation's write-back) never lands over a newer write
    that came meanwhile (the gateway's request). Where links are refused, a check then a
    rename: that window open again, and only there."""
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.{os.getpid()}.tmp")
    try:
        _write_once_more_when_full(tmp, path, data, mode)
    except OSError as exc:
        raise _naming(exc, path) from exc
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in NO_LINKS:
            raise _naming(exc, path) from exc
        if path.exists():
            return False
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    fsync_dir(path.parent)
    return True


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path``, the file meant (an error on a descriptor names none)."""
    return exc if exc.errno is None else type(exc)(exc.errno, exc.strerror, str(path))


def _write_once_more_when_full(tmp: Path, path: Path, data: bytes, mode: int) -> None:
    try:
        _write_tmp(tmp, data, mode)
    except OSError as exc:  # a full disk: the ballast's room, then once more
        if not diskspace.full(exc) or not diskspace.release_for(path):
            raise
        _write_tmp(tmp, data, mode)


def _write_tmp(tmp: Path, data: bytes, mode: int) -> None:
    """The whole of ``data`` in ``tmp``, synced; on failure no tmp file is left."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:  # a short write is what a nearly full disk gives
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)


def sweep_tmp(folder: Path) -> None:
    """Remove the tmp files of writers that died between write and rename (SIGKILL).
    A folder that is a file has none (events/: the journal names it when it writes)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            pid = entry.name.rsplit(".", 2)[-2] if entry.name.endswith(".tmp") else ""
            if entry.name.startswith(".") and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, value: Any, indent: int | None = None) -> None:
    write_atomic(path, json.dumps(value, indent=indent).encode())


# -- the one policy for a file that is not what it should be -------------------------------


def quarantine(state: StateDir, path: Path, reason: str, inode: int | None = None) -> Path | None:
    """Move ``path`` aside with ``reason`` beside it; None when it is gone (or replaced
    since it was read: ``inode``, the one read). Records go to ``quarantine/`` by name
    (``RecordStore.quarantined_at``), other documents to ``quarantine/documents/``."""
    rel = path.relative_to(state.root) if path.is_relative_to(state.root) else Path(path.name)
    records = path.parent == state.instances
    where = state.quarantine if records else state.quarantined_documents
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    base = path.name if records else "~".join(rel.parts)
    target = where / f"{base}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
    try:
        if inode is not None and os.stat(path).st_ino != inode:
            return None  # a writer replaced it since: the new version is read next time
        os.replace(path, target)
        write_atomic(target.with_name(target.name + ".reason"), reason.encode() + b"\n")
    except FileNotFoundError:
        return None
    return target


def _set_aside(state: StateDir, path: Path, exc: Exception, inode: int) -> None:
    """A document that does not decode: quarantined (named), or left if newer (named)."""
    if isinstance(exc, OtherVersion):
        sidefiles.warn(path, f"{exc}: left in place and ignored (the newer reconcile reads it)")
        return
    reason = f"not a valid document: {_detail(exc)}"
    target = quarantine(state, path, reason, inode)
    if target is not None:
        log.warning("state file quarantined", file=str(path), moved_to=str(target), problem=reason)


def _detail(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc)


def read_document(state: StateDir, path: Path, decode: Callable[[Any], T]) -> T | None:
    """``path`` decoded; None when it is absent, unreadable (named) or set aside."""
    try:
        with open(path, "rb") as f:
            inode = os.fstat(f.fileno()).st_ino
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder in its place, no permission: named, never moved
        sidefiles.skipped(path, exc)
        return None
    try:
        return decode(json.loads(raw))
    except NOT_OURS as exc:
        _set_aside(state, path, exc, inode)
        return None


def peek_document(path: Path, decode: Callable[[Any], T], refused: str | None = None) -> T | None:
    """``read_document`` for a reader that must change nothing (``status``, ``describe``,
    ``devices``, the page): a file that does not decode is named (once) and read as
    absent, and stays where it is for a pass to set aside (``refused``: a document no
    pass sets aside, named with the way out :func:`read_or_refuse` gives)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if refused is not None:
            sidefiles.warn(path, _refusal(exc.strerror or str(exc), refused))
            return None
        sidefiles.skipped(path, exc)
        return None
    try:
        return decode(json.loads(raw))
    except OtherVersion as exc:
        sidefiles.warn(path, f"{exc}: left in place and ignored (the newer reconcile reads it)")
    except NOT_OURS as exc:
        problem = f"not a valid document: {_detail(exc)}"
        end = "left in place, read as absent (only a pass moves a file aside)"
        sidefiles.warn(path, _refusal(problem, refused) if refused else f"{problem}; {end}")
    return None


def read_or_refuse(path: Path, decode: Callable[[Any], T], refused: str) -> T | None:
    """``path`` decoded, None when it is absent; a file that does not decode or cannot be
    read raises RecordError naming it, what is wrong and ``refused`` (the way out), and
    stays where it is. For a document whose loss is not a reset but a choice forgotten
    (the git source's pin): setting it aside and reading it as absent would drop that
    choice in silence, so a pass refuses, as etcd refuses a damaged data dir."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder in its place, no permission
        raise RecordError(f"{path}: {_refusal(exc.strerror or str(exc), refused)}") from None
    try:
        return decode(json.loads(raw))
    except NOT_OURS as exc:  # a newer version too: this reconcile cannot keep its pin
        problem = f"not a valid document: {_detail(exc)}"
        raise RecordError(f"{path}: {_refusal(problem, refused)}") from None


def _refusal(problem: str, refused: str) -> str:
    return f"{problem}; left in place and refused: {refused}"


class Document(Generic[T]):
    """One JSON document of the state dir and its codec."""

    def __init__(
        self,
        state: StateDir,
        path: Path,
        decode: Callable[[Any], T],
        encode: Callable[[T], Any],
        *,
        indent: int | None = None,
        refused: str | None = None,
    ) -> None:
        """``refused``: what a bad file's reader is told to do (:func:`read_or_refuse`),
        for a document that must never be set aside; None: the one policy (quarantine)."""
        self.state = state
        self.path = path
        self.decode = decode
        self.encode = encode
        self.indent = indent
        self.refused = refused

    def read(self) -> T | None:
        if self.refused is not None:
            return read_or_refuse(self.path, self.decode, self.refused)
        return read_document(self.state, self.path, self.decode)

    def peek(self) -> T | None:
        return peek_document(self.path, self.decode, self.refused)

    def write(self, value: T) -> None:
        sidefiles.folder_for_write(self.path.parent)
        write_json(self.path, self.encode(value), self.indent)

    def update(self, change: Callable[[T], T], empty: T, what: str) -> T:
        """Read, ``change`` and write back under ``<name>.lock`` (``what`` names it in a
        timeout), so two writers never lose each other's change; written only when it
        changed anything (``empty``: the value of no file)."""
        sidefiles.folder_for_write(self.path.parent)
        lock = FileLock(lock_beside(self.path), what=what)
        lock.acquire(LOCK_WAIT)
        try:
            before = self.read()
            before = empty if before is None else before
            after = change(before)
            if after != before:
                self.write(after)
            return after
        finally:
            lock.release()


class Folder(Generic[T]):
    """A folder of JSON documents, one per name (``<folder>/<name>.json``); only names
    that ``name_ok`` passes become file names (invariant 9) or are read."""

    def __init__(
        self,
        state: StateDir,
        folder: Path,
        decode: Callable[[Any, str], T],
        encode: Callable[[T], Any],
        *,
        name_ok: Callable[[str], bool] = is_dns1123,
    ) -> None:
        self.state = state
        self.folder = folder
        self.decode = decode
        self.encode = encode
        self.name_ok = name_ok

    def path(self, name: str) -> Path:
        if not self.name_ok(name):
            raise ValueError(f"not a deployment name: {name!r}")
        return self.folder / f"{name}.json"

    def write(self, name: str, value: T) -> None:
        path = self.path(name)
        sidefiles.folder_for_write(self.folder)
        write_json(path, self.encode(value))

    def write_new(self, name: str, value: T) -> bool:
        """``write`` only where no file is (:func:`write_new`): False where one was put."""
        path = self.path(name)
        sidefiles.folder_for_write(self.folder)
        return write_new(path, json.dumps(self.encode(value)).encode())

    def read(self, name: str) -> T | None:
        return read_document(self.state, self.path(name), functools.partial(self._decode, name))

    def _decode(self, name: str, data: Any) -> T:
        return self.decode(data, name)

    def read_all(self, *, peek: bool = False) -> dict[str, T]:
        """Every document that decodes; the others are set aside (named) and absent, or
        (``peek``: a reader that must change nothing, `plan`) named and left in place."""
        out: dict[str, T] = {}
        for name, path in self.files():
            decode = functools.partial(self._decode, name)
            value = peek_document(path, decode) if peek else read_document(self.state, path, decode)
            if value is not None:
                out[name] = value
        return out

    def files(self) -> Iterator[tuple[str, Path]]:
        """(name, path) of each document of ours, sorted; a file whose name this tool
        never gives (``README.json``, a tmp file) is not read, nor moved."""
        for path in sidefiles.listed(self.folder, "*.json"):
            name = path.name.removesuffix(".json")
            if not path.name.startswith(".") and self.name_ok(name):
                yield name, path

    def forget(self, name: str) -> None:
        if self.name_ok(name):
            with contextlib.suppress(FileNotFoundError):
                self.path(name).unlink()
