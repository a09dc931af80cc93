"""`reconcile logs [NAME...]`: one path for every mode. Each instance is a log source
(``LocalLog``: its file and rotated backups here; ``RemoteLog``: read through the backend
on a cluster node, its actor reads the file there); one ``show`` prints them (the lines
so far, ``--tail``, ``--previous``) and follows them (``-f``), one thread a source.

Several instances: each line behind its instance's name (``web@1 | ...``, as docker
compose prints services); no NAME is every deployment's; ``--replica I`` shows that
replica of each. One instance: its bytes as the engine wrote them. ``--requests`` is
the gateway's request log (requestsverb.py).

A rolling ``@next`` writes its own log (``logs web@next``) until its promotion hands it
to its instance, the old one's behind it (``--previous``), so the instances here are
replicas only: ``web``, ``web@1``, ...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from controller.cli.common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    FOLLOW_PERIOD,
    config,
    no_such,
    reader_gone,
)
from controller.cli.look import runtimelog
from controller.core.manifest.names import (
    base_name,
    instance_of,
    is_next,
    record_name_ok,
    replica_name,
)
from controller.core.manifest.names import replica_of as index_of
from controller.core.state import Record
from controller.redact import PARTIAL, printable, printable_bytes
from controller.store.config.node import Config
from controller.store.instances import logfiles
from controller.store.instances.records import RecordStore

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from controller.backends.base import Backend


def cmd_logs(args: argparse.Namespace) -> int:
    if args.requests:
        from controller.cli.gateway.requestsverb import cmd_requests

        return _quiet_pipe(lambda: cmd_requests(args))
    if args.previous and args.follow:
        print("reconcile: --previous cannot be followed (that run is over)", file=sys.stderr)
        return EXIT_USAGE
    if args.replica is not None and args.replica < 0:
        print("reconcile: --replica takes 0, 1, ... (replica 0 is NAME itself)", file=sys.stderr)
        return EXIT_USAGE
    cfg = config(args, lenient=True)
    store = RecordStore(cfg.state_dir)
    known = deployments(store)
    # invariant 9: a name no record can have (`Web`, `../x`) is never looked up, only said
    unknown = [n for n in args.names if not record_name_ok(n) or base_name(n) not in known]
    live = recorded(store)
    for asked in unknown:  # `logs web wbe` showed web and said nothing of wbe
        print(no_such(asked, live, cfg.state_dir, gone=known), file=sys.stderr)
    if unknown:
        return EXIT_FAIL
    wanted = list(dict.fromkeys(args.names)) or known
    if not wanted:
        print(f"reconcile: no deployment has a log in {cfg.state_dir}", file=sys.stderr)
        return EXIT_FAIL
    if args.replica is not None:
        beyond = _beyond(store, wanted, args.replica)
        if beyond:
            print(f"reconcile: {beyond}", file=sys.stderr)
            return EXIT_FAIL
    names = [i for d in wanted for i in instances(store, d, args.replica)]
    label = " ".join(wanted) if args.names else "any deployment"
    sources = _sources(args, cfg, store, names)
    if isinstance(sources, int):
        return sources
    added = _added(store, wanted) if args.replica is None and _all_local(sources) else None
    return _quiet_pipe(lambda: show(args, sources, label, added))


def _all_local(sources: Sequence[LogSource]) -> bool:
    return all(isinstance(s, LocalLog) for s in sources)


def _added(store: RecordStore, wanted: list[str]) -> Callable[[], list[LocalLog]]:
    """The replicas of the deployments asked for by their name that have a record and a
    log now: a follow started before a scale-up picks the new ones up (stern does; the
    list was fixed at the start, so `logs -f web` never showed web@3)."""
    bases = [n for n in wanted if n == base_name(n)]

    def now() -> list[LocalLog]:
        names = [i for d in bases for i in instances(store, d, None)]
        return [s for s in (LocalLog(store, n) for n in names) if s.live]

    return now


def _sources(
    args: argparse.Namespace, cfg: Config, store: RecordStore, names: list[str]
) -> list[LogSource] | int:
    """One source an instance: a record on a cluster node is read through the backend
    (every one of them, when several are shown and any is), else the file here."""
    records = {n: store.read(n) for n in names}
    remote = [r for r in records.values() if r is not None and r.on_cluster]
    if not remote:
        boxed = [r for r in records.values() if r is not None and r.container is not None]
        detached = _detached(cfg, store, boxed) if boxed else {}
        return [detached.get(n) or LocalLog(store, n) for n in names]
    if args.previous:
        print("reconcile: --previous is not kept for engines on a cluster", file=sys.stderr)
        return EXIT_USAGE
    if remote[0].backend != cfg.backend:
        print(
            f"reconcile: {remote[0].name} runs on the {remote[0].backend} backend: pass"
            f" --backend {remote[0].backend} (and its address), or set RECONCILE_BACKEND",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from controller.backends.choose import open_backend

    backend = open_backend(cfg)
    return [RemoteLog(backend, r) for r in records.values() if r is not None]


def _detached(cfg: Config, store: RecordStore, boxed: list[Record]) -> dict[str, LogSource]:
    """The container engines of ``boxed`` whose `run` ended while they run on: their log
    file gets nothing more, the runtime's log has it (cli/look/runtimelog.py)."""
    from controller.backends.choose import open_backend

    backend = open_backend(cfg)
    found: dict[str, LogSource] = {}
    for rec in boxed:
        argv = backend.runtime_log(rec)
        if argv is not None and rec.nonce is not None:
            found[rec.name] = ContainerLog(store, rec.name, argv, rec.nonce)
    return found


def _quiet_pipe(show: Callable[[], int]) -> int:
    """``show()``, ending quietly when the reader goes (`reconcile logs x | head`)."""
    try:
        return show()
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _beyond(store: RecordStore, wanted: list[str], replica: int) -> str | None:
    """``--replica I`` past what a deployment has (no record, no log): which it has. It
    said "no log for 'web@5' (never started?)" of a deployment of two replicas."""
    for name in wanted:
        have = instances(store, base_name(name), None)
        if replica_name(base_name(name), replica) not in have:
            return f"{base_name(name)} has no replica {replica}: {_replicas(store, have)}"
    return None


def _replicas(store: RecordStore, have: list[str]) -> str:
    """Those running now, then those with only a log left (scaled away or `down`): the
    list named replicas scaled away with the current ones, as if they still ran."""
    running = {instance_of(n) for n in store.peek().records}
    now = [n for n in have if n in running]
    gone = [n for n in have if n not in running]
    said = f"its replicas are {_listed(now)}" if now else "it runs no replica now"
    return f"{said}; gone, their logs kept: {_listed(gone)}" if gone else said


def _listed(names: list[str]) -> str:
    return ", ".join(f"{index_of(n)} ({n})" for n in names)


def instances(store: RecordStore, name: str, replica: int | None) -> list[str]:
    """Whose logs ``logs NAME`` shows: one replica (``--replica``, or a record's own name),
    else every replica the deployment has a record or a log for (``down`` keeps logs)."""
    if replica is not None:
        return [replica_name(base_name(name), replica)]
    if name != base_name(name):  # a replica, or a rolling `@next`: its own log
        return [name]
    found = {instance_of(n) for n in store.peek().records if base_name(n) == name}
    found |= {p.name.removesuffix(".log") for p in store.logs.glob(f"{name}@*.log")}
    found = {n for n in found if record_name_ok(n) and not is_next(n)}
    return sorted(found | {name}, key=index_of) if found else [name]


def deployments(store: RecordStore) -> list[str]:
    """``logs`` with no NAME: every deployment with a record or a log (``down`` keeps logs)."""
    found = set(recorded(store))
    found |= {p.name.removesuffix(".log") for p in store.logs.glob("*.log")}
    return sorted({base_name(n) for n in found if record_name_ok(n)})  # web@1.log is web's


def recorded(store: RecordStore) -> list[str]:
    """The deployments the node has (a record each), not those whose logs alone are kept."""
    return sorted({base_name(n) for n in store.peek().records})


class LogSource(Protocol):
    """One instance's log, wherever it is kept."""

    name: str
    live: bool  # its instance ran when the source was made (not a log kept alone)

    def missing(self) -> str | None:
        """Why there is nothing to show (None: there is a log)."""
        ...

    def lines(self, tail: int | None) -> Iterator[bytes]:
        """The log so far (its last ``tail`` lines); following goes on from its end."""
        ...

    def previous(self) -> tuple[list[bytes], bool] | None:
        """The run before the last (re)start and whether its head is intact."""
        ...

    def follow(self, write: Callable[[bytes], None], keep_going: Callable[[], bool]) -> None:
        """Write what is appended until ``keep_going()`` says no or the log is gone."""
        ...


class LocalLog:
    """An instance's log file here and its rotated backups (`store/instances/logfiles.py`)."""

    def __init__(self, store: RecordStore, name: str) -> None:
        self.name, self.store, self.path = name, store, store.log_path(name)
        self.live = store.read(name) is not None
        self._mark: tuple[int, int] | None = None  # where `lines` ended: `follow` goes on

    def missing(self) -> str | None:
        if logfiles.stream_files(self.path):
            return None
        return f"no log for {self.name!r} at {self.path} (never started?)"

    def lines(self, tail: int | None) -> Iterator[bytes]:
        self._mark = logfiles.mark(self.path)
        return _lines(self.path, tail, self._mark)

    def previous(self) -> tuple[list[bytes], bool] | None:
        return logfiles.previous_run(self.path)

    def follow(self, write: Callable[[bytes], None], keep_going: Callable[[], bool]) -> None:
        def going() -> bool:  # while the deployment does
            return keep_going() and self.store.read(self.name) is not None

        with contextlib.suppress(FileNotFoundError):  # never written: nothing to follow
            self._mark = logfiles.follow(
                self.path, write, going, poll=FOLLOW_PERIOD, start=self._mark
            )

    def again(self) -> LocalLog:
        """This instance's log once more, from where its follow stopped: it ended (its
        record went: scaled away, `down web@1`) and a record of its name is back."""
        back = LocalLog(self.store, self.name)
        back._mark = self._mark
        return back


class ContainerLog(LocalLog):
    """A container engine's log once its `run` ended while it runs on: the file up to
    this run's marker, then the runtime's log of it; ``-f`` follows the runtime's until
    the container ends, then the file, where a restart writes its next run."""

    def __init__(self, store: RecordStore, name: str, argv: list[str], nonce: str) -> None:
        super().__init__(store, name)
        self.argv: list[str] | None = argv  # the runtime's `logs` (None: the file alone)
        self.nonce, self._shown = nonce, 0  # bytes of the runtime's log shown

    def lines(self, tail: int | None) -> Iterator[bytes]:
        earlier = runtimelog.before_run(self.path, self.nonce)
        said = runtimelog.so_far(self.argv) if self.argv and earlier is not None else None
        if isinstance(said, str) and self.argv:  # the runtime did not give it: say so
            print(printable(runtimelog.unread(self.name, self.argv, said)), file=sys.stderr)
        if earlier is None or not isinstance(said, bytes):  # another run's marker, or unread
            self.argv = None
            return super().lines(tail)
        self._mark, self._shown = logfiles.mark(self.path), len(said)  # the file goes on there
        lines = earlier + said.splitlines(keepends=True)
        return iter(lines if tail is None else lines[-tail:] if tail else [])

    def follow(self, write: Callable[[bytes], None], keep_going: Callable[[], bool]) -> None:
        if self.argv is not None:

            def going() -> bool:
                return keep_going() and self.store.read(self.name) is not None

            runtimelog.follow(self.argv, self._shown, write, going, FOLLOW_PERIOD)
        super().follow(write, keep_going)


class RemoteLog:
    """An instance's log on a cluster node, read through the backend (its actor reads the
    file there); followed by asking for what lies past the offset read so far."""

    def __init__(self, backend: Backend, rec: Record) -> None:
        self.name, self.backend, self.rec = rec.name, backend, rec
        self.live = True
        self.offset = 0
        self._first = backend.log_since(rec, 0)

    def missing(self) -> str | None:
        return None if self._first else f"no log for {self.name!r} (its actor is gone)"

    def lines(self, tail: int | None) -> Iterator[bytes]:
        if self._first is None:
            return iter(())
        data, self.offset = self._first
        lines = data.splitlines(keepends=True)
        if tail is not None:  # as tail_lines counts them: --tail 0 shows none
            lines = lines[-tail:] if tail else []
        return iter(lines)

    def previous(self) -> tuple[list[bytes], bool] | None:
        return None  # refused before (`_sources`): not kept for engines on a cluster

    def follow(self, write: Callable[[bytes], None], keep_going: Callable[[], bool]) -> None:
        while keep_going():
            time.sleep(FOLLOW_PERIOD)  # the backend has no event to wait on: poll
            got = self.backend.log_since(self.rec, self.offset)
            if got is None:
                return  # its actor is gone
            write(got[0])
            self.offset = got[1]


def show(
    args: argparse.Namespace,
    sources: Sequence[LogSource],
    label: str,
    added: Callable[[], list[LocalLog]] | None = None,
) -> int:
    """The sources' logs (several: each line behind its name); ``-f`` then follows each
    of them, and those ``added()`` finds later. ``label`` names several in messages."""
    present = [s for s in sources if s.missing() is None]
    if not present:
        why = sources[0].missing() if len(sources) == 1 else None
        print(
            f"reconcile: {why or f'no replica of {label} has a log (never started?)'}",
            file=sys.stderr,
        )
        return EXIT_FAIL
    width = max(len(s.name) for s in present)
    prefixes = {
        s.name: f"{s.name:<{width}} | ".encode() if len(sources) > 1 else b"" for s in present
    }
    out = log_out()
    if args.previous:
        return _previous(present, prefixes, args.tail, out, label)
    for source in present:
        prefix = prefixes[source.name]
        for line in source.lines(args.tail):
            out.write(prefix + _ended(line) if prefix else line)
    out.flush()
    if args.follow:
        _follow(present, prefixes, out, added)
    return EXIT_OK


def _lines(path: Path, tail: int | None, upto: tuple[int, int] | None) -> Iterator[bytes]:
    if tail is not None:
        yield from logfiles.tail_lines(path, tail, upto)
        return
    carry = b""
    for file in logfiles.stream_files(path):
        try:
            lines = _read(file, upto).splitlines(keepends=True)
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


def _read(file: Path, upto: tuple[int, int] | None) -> bytes:
    """``file``'s bytes, up to ``upto``'s size when it is the file that mark was of."""
    with open(file, "rb") as f:
        if upto is not None and os.fstat(f.fileno()).st_ino == upto[0]:
            return f.read(upto[1])
        return f.read()


def _ended(line: bytes) -> bytes:
    """A prefixed line must end: the next one starts with another replica's name."""
    return line if line.endswith(b"\n") else line + b"\n"


def _previous(
    sources: Sequence[LogSource],
    prefixes: dict[str, bytes],
    tail: int | None,
    out: BinaryIO,
    label: str,
) -> int:
    shown = False
    for source in sources:
        found = source.previous()
        if found is None:
            continue
        lines, intact = found
        prefix = prefixes[source.name]
        if not intact and not prefix:
            print("reconcile: the start of that run was rotated away", file=sys.stderr)
        lines = lines[-tail:] if tail else lines
        out.write(b"".join(prefix + _ended(line) if prefix else line for line in lines))
        shown = True
    out.flush()
    if shown:
        return EXIT_OK
    if len(prefixes) == 1 and not next(iter(prefixes.values())):
        print(
            f"reconcile: {sources[0].name} has no previous run in its log (it has not "
            "restarted, or rotation dropped that run)",
            file=sys.stderr,
        )
    else:
        print(f"reconcile: no replica of {label} has a previous run", file=sys.stderr)
    return EXIT_FAIL


def _follow(
    sources: Sequence[LogSource],
    prefixes: dict[str, bytes],
    out: BinaryIO,
    added: Callable[[], list[LocalLog]] | None,
) -> None:
    """One thread a source; each ends when its instance is gone (its record, its actor),
    said when others go on. A replica ``added()`` finds later is shown from its start and
    followed too, behind its name; one that ended and is back (a record of its name again)
    is followed again from where it stopped, said as stern says a new container; the
    follow ends when every one has ended."""
    lock = threading.Lock()
    broken = threading.Event()  # stdout closed (`| head`): every follower stops
    threads: dict[str, threading.Thread] = {}
    followed: dict[str, LogSource] = {}
    width = max(len(name) for name in prefixes)

    def keep_going() -> bool:
        if reader_gone():  # `logs -f | head -1` on a quiet log: no write would fail
            broken.set()
        return not broken.is_set()

    def others(name: str) -> bool:
        return any(t.is_alive() for n, t in list(threads.items()) if n != name)

    def start(source: LogSource, prefix: bytes, fresh: bool) -> None:
        writer = _LineWriter(prefix, out, lock, broken)
        follower = _Follower(source, writer, keep_going, others, fresh)
        threads[source.name] = thread = threading.Thread(target=follower.run, daemon=True)
        followed[source.name] = source
        thread.start()

    def back(name: str) -> LocalLog | None:
        """The ended follow of an instance whose record is back, to follow again."""
        ended = followed[name]
        if threads[name].is_alive() or not isinstance(ended, LocalLog):
            return None
        with lock:
            print(f"reconcile: {name} is back (a new instance): following it", file=sys.stderr)
        return ended.again()

    for source in sources:
        start(source, prefixes[source.name], fresh=False)
    while any(t.is_alive() for t in list(threads.values())):  # short joins: Ctrl-C
        for thread in list(threads.values()):
            thread.join(FOLLOW_PERIOD)
        for source in added() if added is not None and not broken.is_set() else []:
            prefix = f"{source.name:<{width}} | ".encode()
            if source.name not in threads and source.missing() is None:
                start(source, prefix, fresh=True)
            elif source.name in threads and (again := back(source.name)) is not None:
                start(again, prefix, fresh=False)
    if broken.is_set():
        raise BrokenPipeError


class _Follower:
    """One instance's follow: its log so far first when it came after the start (a
    replica added since), then what it appends until it ends, which is said while the
    others go on (`web@2 ended`: scaled away, or its record removed)."""

    def __init__(
        self,
        source: LogSource,
        writer: _LineWriter,
        keep_going: Callable[[], bool],
        others: Callable[[str], bool],
        fresh: bool,
    ) -> None:
        self.source, self.writer, self.keep_going = source, writer, keep_going
        self.others, self.fresh = others, fresh

    def run(self) -> None:
        if self.fresh:
            for line in self.source.lines(None):
                self.writer.write(line)
        self.source.follow(self.writer.write, self.keep_going)
        self.writer.close()
        if self.source.live and self.keep_going() and self.others(self.source.name):
            with self.writer.lock:
                print(f"reconcile: {self.source.name} ended (its record is gone)", file=sys.stderr)


class _LineWriter:
    """Whole lines, each behind the prefix, so two replicas' lines never interleave (no
    prefix: one instance, its chunks as they come)."""

    def __init__(
        self, prefix: bytes, out: BinaryIO, lock: threading.Lock, broken: threading.Event
    ) -> None:
        self.prefix, self.out, self.lock, self.broken = prefix, out, lock, broken
        self.rest = b""

    def write(self, chunk: bytes) -> None:
        if not self.prefix:  # one instance: its bytes as they come
            self._emit([chunk])
            return
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
