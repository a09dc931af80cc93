"""The request log: ``<state>/gateway/requests.jsonl``, one JSON line per request (issue 39).

Each line says who called what and how it went: ``time`` (UTC, when the request came),
``key`` (the key's label, ``-`` without keys; never the key), ``model``, ``deployment``,
``instance``, ``status``, ``ttfb_s`` (seconds to the answer's first byte: the engine's,
as the client got it; a cold start's waiting comments are no answer), ``first_comment_s``
(seconds to the first waiting comment, waiting.py: the first byte a client held by a cold
start got; null if none was sent), ``duration_s``, ``prompt_tokens`` and
``completion_tokens`` (the engine's ``usage``, usage.py). Never a
request or answer body.

Written off the request path: the handler encodes its line (``line``) and appends it to
a bounded deque (no lock: a deque's append is atomic) and a writer thread appends the
lines to the file, so a slow or full disk never slows a request; when the deque is full
the line is dropped and counted (``reconcile_gateway_request_log_dropped_total``), never
waited for. The writer
is woken only when it sleeps, and once woken gathers lines for ``GATHER`` seconds before
it writes them: the loop pays neither a queue's lock nor a thread's wake per request (a
profile at 32 clients: 15% of the gateway's samples went to the queue, its condition and
the writer's single-line wakes; woken at each line without the gathering, 7% still).
A line is written by an f-string with json's own escaping, not by json's encoder: the
encoder, made anew for every line, cost more than the rest of a request's accounting
(issue 41, benchmarks/RESULTS.md); the writer is handed the bytes.
The file is rotated by size into at most ``keep`` backups (bounded), by rename, not
copy-truncate as the engines' logs are: a follower (``logs --requests -f``) cannot tell a
file truncated and written again up to its offset (lines of one length) from one not
written to, and lost every line after that. A gateway handing over and its successor both
append with ``O_APPEND`` and reopen the file when its path names another (``_open``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from controller.gateway.accounting.usage import Meter
from controller.logsetup import get_logger
from controller.store.instances import logfiles
from controller.store.statedir import StateDir

log = get_logger("reconcile")

QUEUE_MAX = 10_000  # lines waiting for the writer; past it they are dropped (counted)
BATCH = 512  # lines written at once, at most
GATHER = 0.02  # seconds a woken writer gathers lines before writing them (one wake)
CLOSE_WAIT = 5.0  # seconds the writer gets to write what is queued when the gateway ends
# The next move the warning of a failed write gives (a full disk, a path made a folder, a
# folder not writable): its lines are dropped, counted, until a write goes through.
NEXT = (
    "free space on its disk, or make the path a file this user may write; until then its "
    "lines are dropped (reconcile_gateway_request_log_dropped_total) and requests are "
    "served as before; writing resumes by itself"
)
FIELDS = (
    "time",
    "key",
    "model",
    "deployment",
    "instance",
    "status",
    "ttfb_s",
    "first_comment_s",
    "duration_s",
    "prompt_tokens",
    "completion_tokens",
)


def path_in(state_dir: Path) -> Path:
    return StateDir(state_dir).request_log


def line(key: str, deployment: str, status: int, meter: Meter) -> bytes:
    """The line for a request that ended now, its ``FIELDS`` in order, encoded as compact
    JSON with its newline: its figures only, no body, no key. Its strings are escaped by
    json's own function, its numbers written as json writes them (their ``repr``)."""
    now = time.monotonic()
    used = meter.usage
    first, commented = meter.first, meter.commented
    return (
        f'{{"time":"{_when(time.time() - (now - meter.started))}",'
        f'"key":{encode_basestring_ascii(key)},"model":{_text(meter.model)},'
        f'"deployment":{encode_basestring_ascii(deployment)},'
        f'"instance":{_text(meter.instance)},"status":{status!r},'
        f'"ttfb_s":{"null" if first is None else repr(round(first - meter.started, 4))},'
        f'"first_comment_s":'
        f"{'null' if commented is None else repr(round(commented - meter.started, 4))},"
        f'"duration_s":{round(now - meter.started, 4)!r},'
        f'"prompt_tokens":{"null" if used is None else repr(used.prompt)},'
        f'"completion_tokens":{"null" if used is None else repr(used.completion)}}}\n'
    ).encode()


def _text(value: str | None) -> str:
    return "null" if value is None else encode_basestring_ascii(value)


_second: tuple[int, str] = (-1, "")  # the last whole second written, and its text


def _when(at: float) -> str:
    """``at`` (seconds since the epoch) as ``datetime.fromtimestamp(at, UTC)
    .isoformat(timespec="milliseconds")`` writes it (its rounding to the microsecond
    too), the date and time of day made once a second."""
    global _second
    part, whole = math.modf(at)
    micro = round(part * 1e6)  # half to even, as fromtimestamp rounds
    if micro >= 1_000_000:
        whole, micro = whole + 1, micro - 1_000_000
    second = int(whole)
    if _second[0] != second:
        _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_second[1]}.{micro // 1000:03d}+00:00"


class RequestLog:
    """The pending lines and their writer thread."""

    def __init__(
        self,
        path: Path,
        max_bytes: int = logfiles.DEFAULT_MAX_BYTES,
        keep: int = logfiles.DEFAULT_KEEP,
        dropped: Callable[[int], None] = lambda n: None,
        capacity: int = QUEUE_MAX,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._dropped = dropped
        self._capacity = capacity
        self._pending: deque[bytes] = deque()  # lines encoded, each with its newline
        self._wake = threading.Event()  # set: lines are pending (or the log is closing)
        self._closing = threading.Event()  # close() was called: write what is left, end
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._failing = False  # a write failed: said once, until one succeeds again
        self._fd: int | None = None  # kept open between batches (the writer's alone)

    def start(self) -> None:
        self._thread.start()

    def append(self, encoded: bytes) -> None:
        """Keep a line (encoded, with its newline: ``line``) for the writer; never waits (a
        full deque drops it, counted)."""
        if len(self._pending) >= self._capacity:
            self._dropped(1)
            return
        self._pending.append(encoded)
        if not self._wake.is_set():  # the writer sleeps: the one wake for this batch
            self._wake.set()

    def idle(self) -> bool:
        """Nothing waits for the writer (it may still be writing its batch)."""
        return not self._pending

    def close(self) -> None:
        """Write what is pending (up to ``CLOSE_WAIT``), then end the writer."""
        if not self._thread.is_alive():
            return
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=CLOSE_WAIT)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            # The lines of the next moments join this batch (write() sees the event set and
            # wakes no one); close() cuts the gathering short.
            self._closing.wait(GATHER)
            # Cleared before the lines are taken: one appended after this either is taken
            # below or sets the event again (write() sees it clear), so none waits unseen.
            self._wake.clear()
            closing = self._closing.is_set()  # first: lines written before close() are taken
            while self._pending:
                lines: list[bytes] = []
                while self._pending and len(lines) < BATCH:
                    lines.append(self._pending.popleft())
                for piece in _pieces(lines, self.max_bytes):
                    self._append(b"".join(piece), len(piece))
            if closing:
                self._close_fd()
                return

    def _append(self, data: bytes, count: int) -> None:
        try:
            fd = self._open()
            size = os.fstat(fd).st_size
            if size and size + len(data) > self.max_bytes:
                # Before the write, not after: the new lines land in the fresh file, where
                # a follower (logs --requests -f) finds them once it has read the old one.
                logfiles.rename_rotate(self.path, self.keep)
                fd = self._open()  # the path names a new file now
            os.write(fd, data)  # O_APPEND: at the end, past a successor's lines too
        except OSError as exc:
            self._close_fd()
            self._dropped(count)
            if not self._failing:
                log.warning(
                    "request log not written", path=str(self.path), error=str(exc), next=NEXT
                )
            self._failing = True
            return
        if self._failing:  # said, as the warning was: the operator's fix took
            log.info("request log written again", path=str(self.path))
        self._failing = False

    def _open(self) -> int:
        """The file's descriptor, opened again when the file was removed or replaced."""
        if self._fd is not None:
            try:
                same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return self._fd
            self._close_fd()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _pieces(lines: list[bytes], limit: int) -> list[list[bytes]]:
    """``lines`` in runs of at most ``limit`` bytes (a longer line alone): each run is
    one write, and a file rotated before it stays within its size."""
    out: list[list[bytes]] = [[]]
    size = 0
    for line in lines:
        if out[-1] and size + len(line) > limit:
            out.append([])
            size = 0
        out[-1].append(line)
        size += len(line)
    return out


def read_lines(path: Path, tail: int | None = None) -> list[dict[str, Any]]:
    """The log's lines (backups first), the last ``tail`` of them when given; a line a
    rotation cut or a crash left half-written is passed over."""
    raw = logfiles.tail_lines(path, tail) if tail is not None else _all_lines(path)
    found = []
    for one in raw:
        with contextlib.suppress(ValueError):
            value = json.loads(one)
            if isinstance(value, dict):
                found.append(value)
    return found


def _all_lines(path: Path) -> list[bytes]:
    lines: list[bytes] = []
    for part in logfiles.stream_files(path):
        with contextlib.suppress(OSError):
            lines += part.read_bytes().splitlines()
    return lines


def text_line(line: dict[str, Any]) -> str:
    """One line for people: time, status, model -> instance, key, ttfb, duration, tokens."""

    def seconds(value: Any) -> str:
        return f"{value:.3f}s" if isinstance(value, int | float) else "-"

    prompt, completion = line.get("prompt_tokens"), line.get("completion_tokens")
    counted = prompt is not None or completion is not None  # no usage (a 404): not 0+0
    tokens = f"{prompt or 0}+{completion or 0}" if counted else "-"
    where = _printable(line.get("instance") or line.get("deployment") or "-")
    model, key = _printable(line.get("model") or "-"), _printable(line.get("key", "-"))
    return (
        f"{_printable(line.get('time', '-'))}  {_printable(line.get('status', '-'))}  "
        f"{model} -> {where}  key={key}  ttfb={seconds(line.get('ttfb_s'))}  "
        f"took={seconds(line.get('duration_s'))}  tokens={tokens}"
    )


def _printable(value: object) -> str:
    """``value`` for a terminal: the model is the client's text, so a control character
    (an escape sequence, a newline forging a line, a bidi override) or a lone surrogate
    (which no terminal encoding takes: `print` raised) is shown escaped, as ``\\x1b``."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
