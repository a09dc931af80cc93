"""The daemon's notification sender: posts what the passes queued (store/instances/outbox.py).

One thread, never the pass's: a hook that hangs or fails delays no pass. Each hook gets
its notifications in order, one at a time (the oldest first); a failure (no answer, not a
2xx) is retried with exponential back-off (:data:`RETRY_FIRST` doubling up to
:data:`RETRY_MAX`) while the hook's later notifications wait behind it. Each failed try is
a warning, its first one an event in the deployments' journals, and every result a count:
``reconcile_notifications_total{result="delivered|failed|dropped"}``.

Delivery is at-least-once. A file is removed only after its hook answered 2xx, so a
restart (even after a SIGKILL) sends everything still queued; a daemon that dies between
the 2xx and the removal sends that one notification again after its restart. The payload's
``id`` (the same on every try) lets a receiver drop such a repeat.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from controller.logsetup import get_logger
from controller.store.instances import outbox
from controller.store.instances.events import Journal
from controller.store.instances.outbox import Hook, Outbox, Queued
from controller.store.lock import FileLock
from controller.store.statedir import StateDir

log = get_logger("reconcile")

RETRY_FIRST = 1.0  # seconds before the first retry, doubling ...
RETRY_MAX = 300.0  # ... up to this
TIMEOUT = 10.0  # seconds one POST may take
POLL = 1.0  # seconds between looks at the queue (a CLI's `rollback` queues from outside)
# (with no hook in node.yaml a command queues nothing: then only a pass's wake() looks)
METRIC = "reconcile_notifications_total"
RESULTS = ("delivered", "failed", "dropped")


@dataclass
class _Tries:
    failures: int = 0
    next_at: float = 0.0  # monotonic


class Sender:
    def __init__(self, state_dir: Path, hooks: Iterable[Hook]) -> None:
        self.state_dir = state_dir
        self.hooks = {hook.id: hook for hook in hooks}
        self.outbox = Outbox(state_dir)
        self.counts: Counter[str] = Counter()
        self._tries: dict[str, _Tries] = {}  # file name -> its failures so far
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A pass ended (it may have queued some): look now, not at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop at the next look; a POST in flight is not waited for (its file stays and
        the next daemon sends it)."""
        self._stop.set()
        self._wake.set()

    def retarget(self, hooks: Iterable[Hook]) -> None:
        """node.yaml re-read (SIGHUP): the hooks as they are now."""
        with self._lock:
            self.hooks = {hook.id: hook for hook in hooks}
        self._wake.set()  # with hooks now, it polls again

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except Exception as exc:  # the thread must outlive a bad file
                log.warning("notifications not sent this round", error=str(exc))
            with self._lock:
                hooked = bool(self.hooks)
            self._wake.wait(POLL if hooked else None)  # none: an idle daemon wakes it not
            self._wake.clear()

    def round(self) -> None:
        """One look at the queue: each hook's oldest notification, when due, is posted.
        Under the sender lock, tried without waiting: another process posting (a daemon,
        a `--once`) posts these, never both."""
        pending = self.outbox.pending()
        if not pending:
            self._tries.clear()
            return
        lock = FileLock(StateDir(self.state_dir).notify_lock, what="notification sender lock")
        if not lock.try_acquire():
            return
        try:
            self._round(self.outbox.pending())  # read again: the other may have sent some
        finally:
            lock.release()

    def _round(self, pending: list[Queued]) -> None:
        heads: dict[str, Queued] = {}
        for item in pending:
            heads.setdefault(item.hook, item)
        names = {item.path.name for item in pending}
        for gone in set(self._tries) - names:  # dropped by the bound meanwhile
            del self._tries[gone]
        for hook_id, item in heads.items():
            if self._stop.is_set():
                return
            with self._lock:
                hook = self.hooks.get(hook_id)
            if hook is None:
                self._undeliverable(item)
            elif self._due(item):
                self._send(hook, item)

    def flush(self) -> None:
        """``--once``: what is queued, posted now, one try each and in order; a hook's
        first failure leaves its rest queued for the next run (or the daemon)."""
        while True:
            before = self.counts["delivered"]
            self.round()
            if self.counts["delivered"] == before:
                return

    def _due(self, item: Queued) -> bool:
        tries = self._tries.get(item.path.name)
        return tries is None or time.monotonic() >= tries.next_at

    def _send(self, hook: Hook, item: Queued) -> None:
        error = post(hook.url, item.body)
        if error is None:
            # Counted before its file goes: a scrape that sees the outbox empty sees it
            # delivered. A kill right here sends this one again after the restart
            # (at-least-once).
            self._count("delivered")
            self.outbox.remove(item)
            self._tries.pop(item.path.name, None)
            log.info("notification delivered", hook=hook.shown, notification=item.body.get("event"))
            return
        tries = self._tries.setdefault(item.path.name, _Tries())
        tries.failures += 1
        wait = min(RETRY_FIRST * 2 ** (tries.failures - 1), RETRY_MAX)
        tries.next_at = time.monotonic() + wait
        self._count("failed")
        event = str(item.body.get("event"))
        log.warning("notification not delivered", hook=hook.shown, notification=event, error=error,
                    attempt=tries.failures, retry_in=wait)  # fmt: skip
        if tries.failures == 1:
            self._journal(item, f"{event} to {hook.shown}: {error}; retried with back-off")

    def _journal(self, item: Queued, why: str) -> None:
        names = item.body.get("deployments")
        journal = Journal(self.state_dir)
        for name in names if isinstance(names, list) else []:
            journal.append(str(name), "notify", why, "failed")

    def _undeliverable(self, item: Queued) -> None:
        self.outbox.remove(item)
        self._count("dropped")
        log.warning("notification dropped: its hook is no longer in node.yaml's notify",
                    notification=item.body.get("event"), file=item.path.name)  # fmt: skip

    def _count(self, result: str) -> None:
        with self._lock:
            self.counts[result] += 1

    def render(self) -> str:
        """The counters in Prometheus' text format (appended to ``/metrics``)."""
        with self._lock:
            counts = dict(self.counts)
        counts["dropped"] = counts.get("dropped", 0) + outbox.DROPPED.value
        # the metrics module brings prometheus-client, whose package brings http.server and
        # ssl, which a daemon without --metrics-* never needs (tests/test_layering.py)
        from controller.daemon import metrics

        series = [((result,), counts.get(result, 0)) for result in RESULTS]
        return metrics.render(metrics.Families(metrics.family(METRIC, series)))


def post(url: str, body: dict[str, object]) -> str | None:
    """POST ``body`` as JSON; None on a 2xx, else what went wrong (no URL in it: the
    URL may be the hook's secret). A ``user:password@`` in the URL is sent as HTTP Basic
    authentication (urllib would take it for a port)."""
    # imported here: urllib.request brings http.client and ssl (~6 MB), which a daemon
    # without a hook never needs (tests/test_layering.py)
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", "User-Agent": "reconcile"}
    parts = urlsplit(url)
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            answer.read()
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"no answer ({getattr(reason, 'strerror', None) or type(reason).__name__})"
