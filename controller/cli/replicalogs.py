"""`reconcile logs [NAME...]` over deployments and their replicas: every instance's log,
each line behind its instance's name (``web@1 | ...``, as docker compose prints services);
no NAME is every deployment's; ``--replica I`` shows that replica of each. ``-f`` follows
them all at once.

A rolling ``@next`` writes into its instance's log (behind its marker line), so the
instances here are replicas only: ``web``, ``web@1``, ...
"""

from __future__ import annotations

import argparse
import io
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from controller.cli.common import EXIT_FAIL, EXIT_OK, FOLLOW_PERIOD, reader_gone
from controller.core.manifest.names import (
    base_name,
    instance_of,
    is_next,
    record_name_ok,
    replica_name,
)
from controller.core.manifest.names import replica_of as index_of
from controller.redact import PARTIAL, printable_bytes
from controller.store import logfiles
from controller.store.records import RecordStore

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


def instances(store: RecordStore, name: str, replica: int | None) -> list[str]:
    """Whose logs ``logs NAME`` shows: one replica (``--replica``, or a record's own name),
    else every replica the deployment has a record or a log for (``down`` keeps logs)."""
    if replica is not None:
        return [replica_name(base_name(name), replica)]
    if name != base_name(name):
        return [instance_of(name)]
    found = {instance_of(n) for n in store.load().records if base_name(n) == name}
    found |= {p.name.removesuffix(".log") for p in store.logs.glob(f"{name}@*.log")}
    found = {n for n in found if record_name_ok(n) and not is_next(n)}
    return sorted(found | {name}, key=index_of) if found else [name]


def deployments(store: RecordStore) -> list[str]:
    """``logs`` with no NAME: every deployment with a record or a log (``down`` keeps logs)."""
    found = {base_name(n) for n in store.load().records}
    found |= {p.name.removesuffix(".log") for p in store.logs.glob("*.log")}
    return sorted(base_name(n) for n in found if record_name_ok(n))


def show(args: argparse.Namespace, store: RecordStore, names: list[str], label: str) -> int:
    """Several instances' logs (one deployment's replicas, or several deployments'),
    prefixed; ``-f`` then follows each of them. ``label`` names them in messages."""
    present = [n for n in names if logfiles.stream_files(store.log_path(n))]
    if not present:
        print(f"reconcile: no replica of {label} has a log (never started?)", file=sys.stderr)
        return EXIT_FAIL
    width = max(len(n) for n in present)
    prefixes = {n: f"{n:<{width}} | ".encode() for n in present}
    out = log_out()
    if args.previous:
        return _previous(store, prefixes, args, out, label)
    for name, prefix in prefixes.items():
        lines = _lines(store.log_path(name), args.tail)
        out.write(b"".join(prefix + _ended(line) for line in lines))
    out.flush()
    if args.follow:
        _follow(store, prefixes, out)
    return EXIT_OK


def _lines(path: Path, tail: int | None) -> Iterator[bytes]:
    if tail is not None:
        yield from logfiles.tail_lines(path, tail)
        return
    carry = b""
    for file in logfiles.stream_files(path):
        try:
            lines = file.read_bytes().splitlines(keepends=True)
        except FileNotFoundError:  # rotated away while we read
            continue
        if carry and lines:  # a line a rotation cut in two
            lines[0] = carry + lines[0]
            carry = b""
        if lines and not lines[-1].endswith(b"\n"):
            carry = lines.pop()
        yield from lines
    if carry:
        yield carry


def _ended(line: bytes) -> bytes:
    """A prefixed line must end: the next one starts with another replica's name."""
    return line if line.endswith(b"\n") else line + b"\n"


def _previous(
    store: RecordStore,
    prefixes: dict[str, bytes],
    args: argparse.Namespace,
    out: BinaryIO,
    label: str,
) -> int:
    shown = False
    for name, prefix in prefixes.items():
        found = logfiles.previous_run(store.log_path(name))
        if found is None:
            continue
        lines = found[0][-args.tail :] if args.tail else found[0]
        out.write(b"".join(prefix + _ended(line) for line in lines))
        shown = True
    out.flush()
    if not shown:
        print(f"reconcile: no replica of {label} has a previous run", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _follow(store: RecordStore, prefixes: dict[str, bytes], out: BinaryIO) -> None:
    """One thread per replica's log; each ends when that replica's record is gone."""
    lock = threading.Lock()
    broken = threading.Event()  # stdout closed (`| head`): every follower stops
    threads = []
    for name, prefix in prefixes.items():

        def keep_going(name: str = name) -> bool:
            if reader_gone():  # `logs -f | head -1` on a quiet log: no write would fail
                broken.set()
            return not broken.is_set() and store.read(name) is not None

        writer = _LineWriter(prefix, out, lock, broken)
        path = store.log_path(name)
        thread = threading.Thread(target=_follow_one, args=(path, writer, keep_going), daemon=True)
        thread.start()
        threads.append(thread)
    while any(t.is_alive() for t in threads):  # short joins: Ctrl-C still reaches us
        for thread in threads:
            thread.join(FOLLOW_PERIOD)
    if broken.is_set():
        raise BrokenPipeError


def _follow_one(path: Path, writer: _LineWriter, keep_going: Callable[[], bool]) -> None:
    try:
        logfiles.follow(path, writer.write, keep_going, poll=FOLLOW_PERIOD)
    except FileNotFoundError:  # its log was never written: nothing to follow
        return
    writer.close()


class _LineWriter:
    """Whole lines, each behind the prefix, so two replicas' lines never interleave."""

    def __init__(
        self, prefix: bytes, out: BinaryIO, lock: threading.Lock, broken: threading.Event
    ) -> None:
        self.prefix, self.out, self.lock, self.broken = prefix, out, lock, broken
        self.rest = b""

    def write(self, chunk: bytes) -> None:
        lines = (self.rest + chunk).splitlines(keepends=True)
        self.rest = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        self._emit(lines)

    def close(self) -> None:
        if self.rest:
            self._emit([self.rest + b"\n"])
            self.rest = b""

    def _emit(self, lines: list[bytes]) -> None:
        if not lines or self.broken.is_set():
            return
        with self.lock:
            try:
                self.out.write(b"".join(self.prefix + line for line in lines))
                self.out.flush()
            except BrokenPipeError:
                self.broken.set()


def log_out() -> BinaryIO:
    """Where `logs` writes an engine's bytes: as written into a pipe or a file (what the
    engine wrote, as `kubectl logs` gives it, for grep and tools), but on a terminal with
    each control character escaped (`\\x1b[2J` must not clear the screen), as journalctl
    keeps a terminal safe from what a service logged."""
    out = sys.stdout.buffer
    return io.BufferedWriter(_Escaping(out)) if out.isatty() else out


class _Escaping(io.RawIOBase):
    """A terminal's side of `logs`: bytes with their control characters escaped; the end
    of a chunk that may be half of one is held for the next chunk."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.held = out, b""

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        chunk = self.held + bytes(data)
        cut = next((len(p) for p in PARTIAL[::-1] if chunk.endswith(p)), 0)
        self.held = chunk[len(chunk) - cut :] if cut else b""
        self.out.write(printable_bytes(chunk[: len(chunk) - cut]))
        return len(bytes(data))

    def flush(self) -> None:
        if not self.closed:
            self.out.flush()

    def close(self) -> None:
        if not self.closed:
            self.out.write(printable_bytes(self.held))  # a log that ends mid-character
            self.held = b""
            self.out.flush()
        super().close()
