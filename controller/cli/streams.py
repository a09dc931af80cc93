"""The process's stdout and stderr once their reader has gone (`reconcile --once | head -1`).

Python raises BrokenPipeError at the next write to a pipe whose reader has exited. Caught
only in ``main``, it ended a verb where it stood and exited 0: a pass cut off at its first
log line (`--once 2>&1 | true` started nothing after it), `--once | true` or `plan | head`
exiting 0 whatever the pass or plan said. A stream made by :func:`outlive_reader` sends what
is written after that nowhere, so the verb runs to its end and exits with its own code, as
a shell command whose output nobody reads does. Followers (`status -w`, `events -w`,
`logs -f`) keep the plain stdout: the closed pipe is how they end.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


class _ReaderMayGo(io.RawIOBase):
    """fd ``fd``, pointed at /dev/null at the first write its reader is not there for."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__()
        self.fd, self._name = fd, name

    @property
    def name(self) -> str:
        return self._name

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, b: WriteableBuffer, /) -> int:
        data = memoryview(b).cast("B")
        view = data
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BrokenPipeError:  # nobody reads it any more: the rest goes nowhere
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.fd)
                os.close(devnull)
        return len(data)


def outlive_reader(stream: TextIO) -> TextIO:
    """``stream`` (the process's own ``sys.__stdout__`` or ``sys.__stderr__``) as one whose
    writes never raise BrokenPipeError, buffered as it was; any other (a test's capture,
    one already made here) is returned as it is."""
    if stream not in (sys.__stdout__, sys.__stderr__) or not isinstance(stream, io.TextIOWrapper):
        return stream
    stream.flush()
    raw = _ReaderMayGo(stream.fileno(), stream.name)
    buffer = io.BufferedWriter(raw) if isinstance(stream.buffer, io.BufferedWriter) else None
    return io.TextIOWrapper(
        raw if buffer is None else buffer,  # python -u: unbuffered, as it was
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=stream.write_through,
    )
