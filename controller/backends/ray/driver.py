"""The Ray driver in a child process of its own: what dies with the head is it, never us.

Ray's core worker ends the process it lives in when the head's GCS has been gone for a
minute (``gcs_rpc_server_reconnect_timeout_s``) or its raylet dies (``ray stop`` on the
head), and a Ray call blocks while the GCS is down. So ``ray.init`` and every Ray call
run in a child (``driverproc.py``), and this side sends it calls over a socket, each with
a deadline. The child gone, or a deadline missed (the child is then killed), that call
raises :class:`BackendUnavailable`: the pass fails having moved nothing, and the next
call starts a new child, which joins the cluster afresh (a head that came back is a new
session to a driver). Detached actors, and their engines, live on without any driver.

A deadline is sized for a slow answer (a loaded cluster), not for none: a head that is
gone is known sooner by asking its GCS process itself (``address.answers``), before a
pass's first call and every ``PROBE_EVERY`` a call waits, so a lost or stopped head
fails the pass in seconds, whatever the call's deadline.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from typing import Any

from controller.backends.ray.address import answers, reachable
from controller.errors import BackendUnavailable

JOIN_TIMEOUT = 90.0  # the child started, Ray imported, ray.init done (a loaded box: slow)
PROBE_EVERY = 2.0  # a call unanswered this long asks the GCS whether it runs (most end sooner)
NEXT_MOVE = (
    "nothing was started or stopped; the engines' state is unknown until it answers:"
    " bring the Ray head back (`ray start --head`), the next pass adopts what survived"
)
Key = tuple[str, str] | None  # the (state dir, owner) of a backend in the child; None: the cluster


class _Child:
    """One driver process: its socket, and the calls waiting for its answers."""

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self.proc, self.conn = proc, conn
        self.waiting: dict[int, Future[Any]] = {}
        self.sending = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.conn.closed

    def stop(self) -> None:
        """SIGKILL (a Ray call may block it) and reap; then the socket, which the reader
        has seen end by then (closed under a blocked read, its number could be reused)."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        with contextlib.suppress(OSError):
            self.conn.close()


class Driver:
    """One child per process and cluster address (``shared``), as ``ray.init`` is once."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._lock = threading.Lock()  # one child started at a time
        self._child: _Child | None = None
        self._next = 0

    def call(self, key: Key, method: str, args: tuple[Any, ...], timeout: float) -> Any:
        """``method(*args)`` of the child's backend for ``key``, its answer or its error."""
        answer: Future[Any] = Future()
        child = self._started()
        with child.sending:
            self._next += 1
            ident = self._next
            child.waiting[ident] = answer
            try:
                child.conn.send_bytes(pickle.dumps((ident, key, method, args)))
            except OSError as exc:
                child.waiting.pop(ident, None)
                raise self._gone(f"the Ray driver process is gone ({exc})") from exc
        try:
            return self._answer(answer, timeout)
        except FutureTimeout as late:
            child.waiting.pop(ident, None)
            self._stop(child)  # a Ray call blocked: the GCS is down, or the network
            raise self._gone(f"the Ray cluster did not answer {method}{late}") from None

    def _answer(self, answer: Future[Any], timeout: float) -> Any:
        """``answer``'s value within ``timeout``, the GCS asked every PROBE_EVERY meanwhile
        whether it runs; else FutureTimeout with the words after "did not answer": why
        its head is gone, or the deadline."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(FutureTimeout):
                return answer.result(min(PROBE_EVERY, left))
            if (why := answers(self.address)) is not None:
                raise FutureTimeout(f": {why}")
        if answer.done():
            return answer.result()
        raise FutureTimeout(f" in {timeout:g}s")

    def check(self) -> None:
        """The head's GCS asked directly: a closed port, or a process that does not answer,
        fails now, not at a deadline."""
        try:
            self._answering()
        except BackendUnavailable:
            self.stop()  # its Ray calls would block; the next call joins afresh
            raise

    def _answering(self) -> None:
        reachable(self.address)  # its words name the address and the next move
        why = answers(self.address)
        if why is not None:
            raise self._gone(f"the Ray cluster did not answer: {why}")

    def stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.stop()

    def _stop(self, child: _Child) -> None:
        with self._lock:
            if self._child is child:
                self._child = None
        child.stop()

    def _gone(self, why: str) -> BackendUnavailable:
        return BackendUnavailable(f"Ray cluster at {self.address}: {why}; {NEXT_MOVE}")

    def _started(self) -> _Child:
        with self._lock:
            if self._child is not None and self._child.alive():
                return self._child
            if self._child is not None:
                self._child.stop()
                self._child = None
            self._answering()  # ray.init waits out JOIN_TIMEOUT on a head that is gone
            ours, theirs = socket.socketpair()
            fd = theirs.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-m", "controller.backends.ray.driverproc", str(fd), self.address],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # our stdout is the CLI's answer (-o json)
            )
            theirs.close()
            child = _Child(proc, Connection(ours.detach()))
            self._joined(child)
            self._child = child
            reader = threading.Thread(target=self._read, args=(child,), name="ray", daemon=True)
            reader.start()
            return child

    def _joined(self, child: _Child) -> None:
        """The child's first word: joined, or why not (its BackendUnavailable)."""
        if not child.conn.poll(JOIN_TIMEOUT):
            child.stop()
            raise self._gone(f"the Ray driver did not join in {JOIN_TIMEOUT:g}s")
        try:
            error = pickle.loads(child.conn.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            code = child.proc.wait()
            child.stop()
            raise self._gone(f"the Ray driver process ended at its start (code {code})") from exc
        if error is not None:
            child.stop()
            raise error

    def _read(self, child: _Child) -> None:
        """The answers, each to its waiting call; at the child's end, fail those left."""
        while True:
            try:
                ident, ok, value = pickle.loads(child.conn.recv_bytes())
            except (EOFError, OSError, pickle.UnpicklingError, ValueError):
                break
            answer = child.waiting.pop(ident, None)
            if answer is None:
                continue  # its caller gave up (a deadline)
            if ok:
                answer.set_result(value)
            else:
                answer.set_exception(value)
        code = child.proc.poll()
        with child.sending:
            left, child.waiting = child.waiting, {}
        for answer in left.values():
            answer.set_exception(self._gone(f"the Ray driver process ended (code {code})"))


_drivers: dict[str, Driver] = {}
_made = threading.Lock()


def shared(address: str) -> Driver:
    """This process's driver for ``address`` (the CLI's pass and its inventory: one child)."""
    with _made:
        return _drivers.setdefault(address, Driver(address))
