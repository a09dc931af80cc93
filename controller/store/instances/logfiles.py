"""Engine log files: a marker line at each (re)start, rotation by size, reading back.

The engine writes ``logs/<name>.log`` through a descriptor opened with ``O_APPEND``
that it keeps for its whole life, and it outlives the reconciler, so the file can
never be renamed under it. Rotation is therefore *copy-truncate* (logrotate's
``copytruncate``): the backups shift (``.log.1`` → ``.log.2`` …), the current file
is copied to ``.log.1`` and truncated to zero; the engine's next ``O_APPEND`` write
lands at the new end, offset 0, so no hole appears. A line the engine writes in the
instant between the last copy and the truncate is lost; that is the price of never
touching the engine's descriptor. Rotation runs at every spawn and after every pass,
so a chatty engine grows its log by at most what it writes between two passes.

Read back, the backups (oldest first) and the current file are one stream; a line
cut by a rotation joins up again. The marker lines split the stream into runs:
``--previous`` is the run before the last (re)start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from controller.store import diskspace

DEFAULT_MAX_BYTES = 10 * 1024 * 1024  # Kubernetes' containerLogMaxSize
DEFAULT_KEEP = 3  # backups: at most (KEEP + 1) x MAX_BYTES per deployment, plus one pass
MARKER_HEAD = b"--- "
MARKER_TAG = b" reconcile: "
BLOCK = 64 * 1024


def write_marker(path: Path, text: str) -> None:
    """Append the line that opens a run: ``--- <time> reconcile: <text>``."""
    _append(path, f"{MARKER_HEAD.decode()}{_stamp()}{MARKER_TAG.decode()}{text}")


def write_note(path: Path, text: str) -> None:
    """Append ``<time> reconcile: <text>``: a word of ours inside the current run (not a
    marker: it opens no run), such as a start that never happened after its marker."""
    _append(path, f"{_stamp()}{MARKER_TAG.decode()}{text}")


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def is_marker(line: bytes) -> bool:
    return line.startswith(MARKER_HEAD) and MARKER_TAG in line[:64]


def backup(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


def stream_files(path: Path) -> list[Path]:
    """The backups that exist, oldest first, then the current file (if it exists)."""
    found = []
    for child in path.parent.glob(f"{path.name}.*"):
        suffix = child.name[len(path.name) + 1 :]
        if suffix.isdigit():
            found.append((int(suffix), child))
    files = [p for _, p in sorted(found, reverse=True)]
    return [*files, path] if path.exists() else files


# -- rotation ------------------------------------------------------------------------------


def rotate(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP) -> bool:
    """Copy-truncate ``path`` once it is over ``max_bytes``; True when it rotated.

    On a full disk the copy cannot be made and the file is truncated all the same, its
    lines lost (said in a note): kept whole, the log that most likely filled the disk
    went on filling it, and no pass could write a record again to restart anything."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    _shift_backups(path, keep)
    with open(path, "r+b") as current:
        kept = keep <= 0 or _copied_to(current, backup(path, 1))
        current.truncate(0)  # right after the copy's last read: the window stays tiny
    if not kept:
        dropped = f"{path.name}'s lines since its last rotation were dropped"
        with contextlib.suppress(OSError):  # a word, not worth failing the rotation for
            write_note(path, f"{dropped}, not kept in {backup(path, 1).name}: its disk was full")
    return True


def rename_rotate(path: Path, keep: int = DEFAULT_KEEP) -> None:
    """Rotate a file whose writers reopen it by path (the request log): ``path`` becomes
    backup 1 (a new inode for the next writes). A follower holding the old file reads
    its last lines there before it moves on; after a copy-truncate it cannot tell a file
    truncated and written again up to its offset from one not written to at all."""
    _shift_backups(path, keep)
    if keep > 0:
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, backup(path, 1))
    else:
        path.unlink(missing_ok=True)


def hand_over(new: Path, into: Path, keep: int = DEFAULT_KEEP) -> None:
    """A promoted ``@next``'s log ``new`` (its backups too) becomes ``into``, and the old
    instance's file moves behind it, its newest backup: each instance's lines stay in its
    own run, its last ones (written beside the new one, or as it stopped) included.
    Renames only: each engine's descriptor follows its own file wherever it moves. Run
    again after a crash part way, it moves what is left (nothing, once ``new`` is gone).
    """
    if not new.exists():
        return
    behind = [p for p in stream_files(new) if p != new]  # new's backups, oldest first
    shift = len(behind) + 1
    for index in range(keep, 0, -1):  # into's backups up by ``shift``, past ``keep`` gone
        _move(backup(into, index), backup(into, index + shift), index + shift <= keep)
    _move(into, backup(into, shift), shift <= keep)
    for old in behind:
        index = int(old.name.rsplit(".", 1)[1])
        _move(old, backup(into, index), index <= keep)
    os.replace(new, into)


def _move(path: Path, to: Path, kept: bool) -> None:
    with contextlib.suppress(FileNotFoundError):
        if kept:
            os.replace(path, to)
        else:
            path.unlink()


def _shift_backups(path: Path, keep: int) -> None:
    """The oldest backup dropped, each other one number up: backup 1's place is free."""
    if keep > 0:
        backup(path, keep).unlink(missing_ok=True)
    for index in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(backup(path, index), backup(path, index + 1))


def _copied_to(source: BinaryIO, target: Path) -> bool:
    """Copy ``source`` to ``target``; False on a full disk, the partial copy removed (it
    held the room the disk lacks)."""
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, BLOCK)
            out.write(source.read())  # whatever the engine appended during the copy
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if diskspace.full(exc):
            return False
        raise
    os.replace(tmp, target)
    return True


def rotate_all(
    folder: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP
) -> list[Path]:
    """Rotate every ``*.log`` in ``folder`` that is over the bound."""
    try:
        logs = sorted(folder.glob("*.log"))
    except OSError:
        return []
    out = []
    for path in logs:
        try:
            if rotate(path, max_bytes, keep):
                out.append(path)
        except OSError:
            continue  # a log we cannot rotate must not stop the pass
    return out


# -- reading -------------------------------------------------------------------------------


def copy_stream(path: Path, out: BinaryIO) -> None:
    for file in stream_files(path):
        with contextlib.suppress(FileNotFoundError), open(file, "rb") as f:
            shutil.copyfileobj(f, out, BLOCK)


def mark(path: Path) -> tuple[int, int] | None:
    """The current file's (inode, size) now: a read of the log so far ends there, and a
    follow begins there, so a line written between the two is shown once, not lost."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


def _end(f: BinaryIO, upto: tuple[int, int] | None) -> int:
    """Where a read of ``f`` stops: ``upto``'s size in the file it marked, else its end."""
    end = f.seek(0, os.SEEK_END)
    if upto is not None and os.fstat(f.fileno()).st_ino == upto[0]:
        return min(end, upto[1])
    return end


def tail_lines(path: Path, count: int, upto: tuple[int, int] | None = None) -> list[bytes]:
    """The last ``count`` lines of the stream, reading backwards from its end (``upto``:
    from a ``mark`` of it)."""
    if count <= 0:
        return []
    chunks: list[bytes] = []
    newlines = 0
    for file in reversed(stream_files(path)):
        with contextlib.suppress(FileNotFoundError), open(file, "rb") as f:
            end = _end(f, upto)
            while end > 0 and newlines <= count:
                start = max(0, end - BLOCK)
                f.seek(start)
                block = f.read(end - start)
                chunks.append(block)
                newlines += block.count(b"\n")
                end = start
        if newlines > count:
            break
    return b"".join(reversed(chunks)).splitlines(keepends=True)[-count:]


def runs(path: Path) -> list[list[bytes]]:
    """The stream split at marker lines; a run before the first marker lost its head."""
    out: list[list[bytes]] = [[]]
    for file in stream_files(path):
        with contextlib.suppress(FileNotFoundError):
            data = file.read_bytes()
            lines = data.splitlines(keepends=True)
            if out[-1] and not out[-1][-1].endswith(b"\n") and lines:
                out[-1][-1] += lines.pop(0)  # a line cut by a rotation
            for line in lines:
                if is_marker(line):
                    out.append([])
                out[-1].append(line)
    return [run for run in out if run]


def previous_run(path: Path) -> tuple[list[bytes], bool] | None:
    """The run before the last (re)start and whether its head is intact; None if none."""
    found = runs(path)
    if len(found) < 2:
        return None
    run = found[-2]
    return run, is_marker(run[0])


def read_from(path: Path, offset: int) -> tuple[bytes, int] | None:
    """The log from ``offset`` on (all of it if the file is now shorter: rotated), and the
    offset to ask next; None if there is no log."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset if offset <= size else 0)
            return f.read(), f.tell()
    except FileNotFoundError:
        return None


def current_run_tail(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of the current run (after its marker), as text."""
    lines = tail_lines(path, count + 1)
    for i in range(len(lines) - 1, -1, -1):
        if is_marker(lines[i]):
            lines = lines[i + 1 :]
            break
    return [line.decode("utf-8", "replace").rstrip("\n") for line in lines[-count:]]


def follow(
    path: Path,
    write: Callable[[bytes], None],
    keep_going: Callable[[], bool],
    poll: float = 0.2,
    start: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """Write what is appended to ``path`` from its current end (``start``: from a ``mark``
    of it), like ``tail -F``; returns where it stopped, a ``start`` for a later follow.

    A copy-truncate (the file shrank) or a new file restarts from offset 0. Ends
    once ``keep_going()`` says so and nothing more is left to read.
    """
    chunks = _follow_chunks(path, keep_going, poll, start)
    while True:
        try:
            write(next(chunks))
        except StopIteration as stop:
            end: tuple[int, int] = stop.value
            return end


def _follow_chunks(
    path: Path, keep_going: Callable[[], bool], poll: float, start: tuple[int, int] | None
) -> Generator[bytes, None, tuple[int, int]]:
    f = open(path, "rb")  # noqa: SIM115 - reopened on rotation below
    try:
        if start is not None and os.fstat(f.fileno()).st_ino != start[0]:
            # Replaced since the mark (rotated, handed over): the backups newer than the
            # marked file, then this one from its start, as a rotation seen below.
            yield from _rotated_since(path, start[0])
        else:
            f.seek(_end(f, start))
        while True:
            chunk = f.read(BLOCK)
            if chunk:
                yield chunk
                continue
            try:
                info = path.stat()
            except FileNotFoundError:
                info = None
            if info is not None and info.st_ino != os.fstat(f.fileno()).st_ino:
                last = f.read()  # what was written to the old file before it was replaced
                if last:
                    yield last
                yield from _rotated_since(path, os.fstat(f.fileno()).st_ino)
                f.close()
                f = open(path, "rb")  # noqa: SIM115
                continue
            if info is not None and info.st_size < f.tell():
                f.seek(0)  # copy-truncated: the engine writes from offset 0 again
                continue
            if not keep_going():
                # What was written between the last read and the answer (an engine's
                # last lines before it was stopped and its record went): read once more.
                last = f.read()
                if last:
                    yield last
                return os.fstat(f.fileno()).st_ino, f.tell()
            time.sleep(poll)
    finally:
        f.close()


def _rotated_since(path: Path, old: int) -> Iterator[bytes]:
    """The backups newer than the one the file ``old`` (a follower's) became, oldest
    first: rotated by rename more than once between two looks, their lines are there."""
    newer: list[Path] = []
    for index in range(1, 64):
        try:
            if backup(path, index).stat().st_ino == old:
                break
        except FileNotFoundError:
            return  # the old file is gone past the backups kept: nothing to add
        newer.append(backup(path, index))
    for one in reversed(newer):
        with contextlib.suppress(FileNotFoundError):
            yield one.read_bytes()
