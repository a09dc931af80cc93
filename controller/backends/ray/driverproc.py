"""The Ray driver process (``driver.py`` starts it): joins the cluster, serves calls.

``python -m controller.backends.ray.driverproc FD ADDRESS``: FD is its end of a socket
to the process that started it. Its first message is None (joined) or the
:class:`BackendUnavailable` that says why not. Then each request ``(id, key, method,
args)`` runs on a thread of its own (a pass launches replicas concurrently) against the
:class:`RayBackend` of ``key`` (state dir, owner), its puller (``puller.<method>``, the
puller's own arguments first), or the cluster (key None), and its answer goes back as
``(id, ok, value)``. The socket's end (the parent is gone) ends it at once, whatever Ray
call is blocked. Nothing here outlives it: a new driver makes each backend afresh.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ray.exceptions import RayError

from controller.backends.ray import cluster
from controller.backends.ray.backend import RayBackend
from controller.backends.ray.pulls import RayPuller
from controller.errors import BackendUnavailable, SpawnError

CALLS = 32  # at once: a pass's launches (RayBackend.launch_concurrency) and its looks


class Served:
    """The backends (and their pullers) this driver holds, by (state dir, owner)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.backends: dict[tuple[str, str], RayBackend] = {}
        self.pullers: dict[tuple[str, str], RayPuller] = {}
        self.lock = threading.Lock()

    def run(self, key: tuple[str, str] | None, method: str, args: tuple[Any, ...]) -> Any:
        if key is None:
            return {"inventory": cluster.inventory}[method](*args)
        with self.lock:
            if key not in self.backends:
                self.backends[key] = RayBackend(self.address, *key)
            backend = self.backends[key]
        if method == "open":
            return None  # made above
        if method.startswith("puller."):  # (state dir, stall seconds, *args): a new
            state_dir, stall, *rest = args  # driver makes the puller afresh
            with self.lock:
                if key not in self.pullers:
                    self.pullers[key] = backend.puller(Path(state_dir), stall)
            return getattr(self.pullers[key], method.removeprefix("puller."))(*rest)
        return getattr(backend, method)(*args)


def _answer(conn: Connection, sending: threading.Lock, served: Served, request: bytes) -> None:
    ident, key, method, args = pickle.loads(request)
    try:
        reply = (ident, True, served.run(key, method, args))
    except RayError as exc:  # what no Ray call of the backend expects: the cluster's state
        why = f"Ray cluster at {served.address}: {type(exc).__name__}: {exc}"
        reply = (ident, False, BackendUnavailable(why))
    except Exception as exc:  # the caller's error to judge, as it was in one process
        reply = (ident, False, _portable(exc))
    try:
        data = pickle.dumps(reply)
    except Exception as exc:  # an answer that cannot travel: its caller must not wait on
        data = pickle.dumps((ident, False, SpawnError(f"{method}'s answer: {exc}")))
    with sending:
        conn.send_bytes(data)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives a pickle round trip, else a SpawnError with its words."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return SpawnError(f"{type(exc).__name__}: {exc}")
    return exc


def main(argv: list[str]) -> None:
    conn = Connection(int(argv[1]))
    try:
        cluster.connect(argv[2])
    except BackendUnavailable as exc:
        conn.send_bytes(pickle.dumps(exc))
        os._exit(1)
    conn.send_bytes(pickle.dumps(None))
    served, sending = Served(argv[2]), threading.Lock()
    pool = ThreadPoolExecutor(CALLS, thread_name_prefix="call")
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone: no Ray call of ours may keep us
        pool.submit(_answer, conn, sending, served, request)


if __name__ == "__main__":
    main(sys.argv)
