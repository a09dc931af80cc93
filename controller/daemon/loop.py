"""The daemon: folder events, timers and engine exits, each turned into one pass.

One thread runs the loop: a selector over a wake-up pipe (folder events from the
watchdog thread, signals) and one pidfd per running engine, with the nearest
timer as its timeout: the debounce, the resync, a probe or a readiness deadline
due, a back-off over, a watchdog ping. Passes are level-triggered: whatever woke
the loop, the pass re-reads the folders and the records. Engines outlive the
daemon: SIGTERM/SIGINT finish the round in flight and exit 0; the next daemon
adopts the engines from their records. SIGHUP re-reads the node and resyncs.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, ParamSpec, Protocol, TypeVar

from controller import failpoints
from controller.backends.base import Backend
from controller.backends.choose import inventory_for, open_backend
from controller.core.actions import Conflict, Hold, HoldChange
from controller.core.elapsed import BootClock
from controller.core.manifest.specs import base_name
from controller.core.plan import backoff
from controller.core.state import NEWEST_VERSION, Activation, Phase, ProcessRef, Record
from controller.daemon.engine_exits import FALLBACK_PERIOD, ExitWatch
from controller.daemon.folders import ManifestWatch, Stamp, stamps
from controller.daemon.gitfetch import Fetcher
from controller.daemon.notify import Notifier, status_field
from controller.daemon.timers import (
    WRITE_HOLD_MAX,
    WRITE_QUIET,
    Settling,
    Timers,
    debounce_until,
)
from controller.daemon.webhooks import Sender
from controller.errors import (
    BackendUnavailable,
    ConfigError,
    LockTimeout,
    ReconcileError,
    StateDirReplaced,
)
from controller.host import bootclock, procstat
from controller.logsetup import get_logger
from controller.reconciler import unreachable
from controller.reconciler.liveness import LivenessProber
from controller.reconciler.run import PassResult, Reconciler
from controller.store.config import accesstoken
from controller.store.config.node import Config
from controller.store.instances.records import RecordStore
from controller.store.lock import FileLock
from controller.store.side import activation, daemonset, refused
from controller.store.statedir import StateDir

if TYPE_CHECKING:  # a daemon that follows no git source never loads it
    from controller.store.sources.git.source import GitSource

log = get_logger("reconcile")

DEBOUNCE = 0.1  # seconds of quiet after a folder event before the pass
SETTLE = 0.01  # ... after a file was closed or renamed into place: that change is whole
DEBOUNCE_MAX = 1.0  # a steady stream of events still gets a pass this often
# What a daemon whose passes are refused (replaced.py) says of its gateway, held meanwhile.
FRONT_HELD = "theirs, if one serves, serves on; this one starts once a pass goes through"
LOCK_WAIT = 1.0  # per try: the loop stays responsive while a cron pass holds the lock
LOCK_RETRY = 0.2
SLACK = 0.005  # fire just after a record's due time, never just before
HELD_RECHECK = 1.0  # seconds: a back-off that is over but held (drained, waiting its turn)
# Terminating too: a deferred teardown (launcher.py ``begin``) is finished by the pass its
# engine's exit asks for, or by the one at its grace's end (``_next_due``).
WATCHED = (Phase.STARTING, Phase.READY, Phase.TERMINATING)
AT_ONCE = "folder at once"  # the pass of a first whole change after quiet (_debounce)
# A manifest still being written holds every pass until its close (timers.Settling.held);
# the timer wakes the loop at the hold's bound, and the log says which file it waits for.
WRITE_HELD = "pass waits for a manifest still being written"
# ... and a pass whose manifests changed as it read them (a writer that began after it):
# what it read may be a prefix, so it applies nothing and the next pass reads them again.
TORN_READ = "pass applied nothing: a manifest changed while the pass read it"
HELD = "write held"
# What a pass stopped by the state dir's disk (full, failing, not writable) leaves to do.
IO_NEXT = (
    "free space on (or fix the permissions of) the disk it names: the daemon tries again at "
    "every resync (SIGUSR1: now), resuming from the records on disk"
)
# ... and by a disk mounted read-only (an ext4 `errors=remount-ro` after an I/O error, a
# read-only bind mount), which no free space or file mode mends.
READ_ONLY_NEXT = (
    "the disk it names is mounted read-only (after a disk error, the kernel remounts it so: "
    "see dmesg): mend it and mount it read-write again; the daemon tries again at every "
    "resync (SIGUSR1: now), resuming from the records on disk"
)
# ... and by a folder where reconcile keeps a file, or a file where it keeps a folder (a
# hand's `mkdir`, a restore gone wrong), which no free space mends either.
MISPLACED_NEXT = (
    "a folder stands where reconcile keeps a file (or a file where it keeps a folder): move "
    "it away; the daemon tries again at every resync (SIGUSR1: now), resuming from the "
    "records on disk"
)


def _io_next(code: int | None) -> str:
    """The next move a pass's I/O error asks for, by its errno."""
    if code == errno.EROFS:
        return READ_ONLY_NEXT
    if code in (errno.EISDIR, errno.ENOTDIR):
        return MISPLACED_NEXT
    return IO_NEXT


GIT_FETCH = "git fetch"  # the git source's own timer (its interval), and its fetch's end
GIT_MOVE = "git move retry"  # a failed move's back-off ended: a pass moves again
TIMED = frozenset(
    {GIT_FETCH, GIT_MOVE, "resync", "probe due", "liveness", "back-off held", "pull progress"}
)
PROBES = "liveness probes"  # the timer that starts the liveness probes due (no pass)
PULL_RECHECK = 1.0  # seconds between passes while a model is pulled (its end starts it)
AUTOSCALE_PERIOD = 0.5  # seconds between looks at the load of autoscaled deployments

Reload = Callable[[], Config]
P = ParamSpec("P")
T = TypeVar("T")


class FrontDoor(Protocol):
    """What the daemon needs of the gateway (injected by the CLI; never imported here).

    The gateway itself is a process that outlives the daemon: ``start`` adopts or starts
    it (and watches it: a crash is restarted at once), ``stop`` leaves it serving."""

    def start(self, request_pass: Callable[[], None]) -> None: ...
    def after_pass(self, result: PassResult, seconds: float) -> None: ...
    def drain(self, old: Record, new: Record | None) -> None: ...
    def ask_drain(self, old: Record, new: Record | None) -> bool: ...
    def drain_answered(self, old: Record) -> bool: ...
    def end_drain(self, old: Record) -> None: ...
    def resume_drain(self, old: Record) -> bool: ...
    def reload(self, config: Config) -> None: ...
    def stop(self) -> None: ...


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        resync: float = 5.0,
        reload: Reload | None = None,
        front: FrontDoor | None = None,
        store: RecordStore | None = None,
        lock: FileLock | None = None,
    ) -> None:
        self.config = config
        self.resync = resync
        self.lock = lock  # the daemon lock held: while it is the state dir's, passes run
        self.reload_config = reload or (lambda: self.config)
        self.front = front
        self._front_open = False  # started (or adopted) the gateway: ``_open_front``
        # The one record store of the state dir: the reconciler and the backend share it.
        self.store = store if store is not None else RecordStore(config.state_dir)
        self.reconciler = build_reconciler(config, open_backend(config, self.store), self.store)
        # Liveness probes run on worker threads at their own periods; an answer that
        # matters (a failure, a recovery) asks for a pass, which counts it.
        self.liveness = LivenessProber(background=True, on_answer=self._liveness_answered)
        self.reconciler.liveness = self.liveness
        self.reconciler.executor.launcher.defer_stops = True  # no grace period holds the loop
        self._probe_news = self._probes_moved = False  # set from the probes' threads
        self._hook_front(self.reconciler)
        self._asked = False  # the gateway asked for a pass (set from its thread)
        self._signalled = False  # SIGUSR1 asked for one
        self.reconciler.interrupted = lambda: self.stopping
        self.reconciler.fetched_apart = True
        # The git source fetches on a thread of its own; its end asks for a pass (the move)
        self.fetcher = Fetcher(self._fetch_done)
        self._fetch_ended = False  # set from the fetch's thread
        self.notifier = Notifier.from_environ()
        # node.yaml's notify: the passes queue, this thread posts (a hook never delays one)
        self.webhooks = Sender(config.state_dir, config.notify)
        self.reconciler.after_pass.append(lambda result, seconds: self.webhooks.wake())
        if config.metrics_file or config.metrics_port:  # prometheus-client brings ssl
            from controller.daemon.metrics import add_source

            add_source(self.webhooks.render)
        self.selector = selectors.DefaultSelector()
        self.timers = Timers()
        self.exits = ExitWatch(self.selector, self.reconciler.backend, self._exited)
        self.folders = ManifestWatch(config.manifests, self._folder_changed)
        self.triggers: set[str] = set()
        self.passes = 0
        self.stopping = False
        self.reloading = False
        self._ready_sent = False
        self._status = ""  # the last STATUS= sent: a pass that waits again says it once
        self._refused: str | None = None  # why the last reload was refused (STATUS= says it)
        self._debounce_since: float | None = None
        self._last_change: float | None = None  # monotonic time of the last folder event seen
        self._quiet_before = True  # the changes now in motion came after a quiet spell
        self._said: dict[str, str] = {}
        self._events = threading.Lock()
        self._folder_event = False  # a folder event since the loop last woke
        self._settling = Settling()  # what those events left in motion (the watchdog thread's)
        self._held_by: str | None = None  # the file the passes wait for, once said
        self._torn: tuple[str, float] | None = None  # a pass's read torn: which file, since
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)

    # -- the loop --------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        # The kernel hands a process's signal to any thread not blocking it (the watch's,
        # the webhooks'), and Python runs the handler only once the main thread runs: idle
        # in its select, it never woke (a SIGTERM went unheard for the hour to the resync).
        # Each signal also writes its number here, whichever thread took it: the select
        # wakes, and the handler runs first (Python marks it before it writes).
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.folders.start()
        # Read now, the configuration a daemon before this one refused at a SIGHUP is moot.
        refused.clear(self.config.state_dir, refused.NODE_CONFIG)
        self.webhooks.start()  # what a daemon before this one left queued goes out now
        self._open_front()
        self.triggers.add("start")
        if self.notifier.ping_interval:
            self.timers.after("watchdog", 0)
        log.info("daemon started", pid=os.getpid(), folders=[str(f) for f in self.folders.folders])
        # The YAML reader is imported when a file first needs parsing (a CLI verb reading
        # cached files never pays it): a daemon takes it now, not on the first manifest
        # written while it watches (measured: 0.18 s of that start, on a busy host).
        threading.Thread(target=_import_yaml, name="import yaml", daemon=True).start()
        try:
            while not self.stopping:
                if self.triggers and self._held_until(self.triggers) is None:
                    self._pass()
                    continue
                self._wait()
        finally:
            self._shutdown()
        return 0

    def _wait(self) -> None:
        for ready, _ in self.selector.select(self.timers.timeout(time.monotonic())):
            ready.data()
        if self.reloading:
            self._reload()
        for key, label in self.timers.pop_due(time.monotonic()):
            self._fired(key, label)

    def _fired(self, key: str, label: str) -> None:
        if key == "watchdog":
            self.notifier.send("WATCHDOG=1")
            self.timers.after("watchdog", self.notifier.ping_interval or 0)
        elif key == "liveness":
            self.exits.check()
            self._arm_liveness()
        elif key == PROBES:
            self.liveness.start_due()
            self._arm_probes()
        elif key == "autoscale":
            self._autoscale()
        elif key == GIT_FETCH:
            self._fetch()
        elif key == HELD:
            pass  # the hold's bound: the loop looks again
        elif key == "debounce" and (until := self._held_until({label})) is not None:
            # The file's close (or the hold's bound) decides; the cap is for a stream of
            # events, and the close's settle must still let a multi-file edit land whole.
            self._debounce_since = None
            self.timers.set("debounce", until, label)
        else:
            self.triggers.add(label)

    def _held_until(self, due: set[str]) -> float | None:
        """When a manifest seen written and not yet closed lets the passes go (None: none
        holds them): a pass now would read its prefix, which may be valid YAML declaring
        fewer deployments, and stop the others' engines. Said once per file, when a pass
        is due (``due``: the passes' triggers)."""
        now = time.monotonic()
        with self._events:
            held = self._settling.held(now)
        if held is None:
            self._held_by = None
            self.timers.cancel(HELD)
            return None
        path, until = held
        if self._held_by != path:
            self._held_by = path
            then = f"read at its close, or after {WRITE_QUIET:g} s with no write to it"
            log.info(WRITE_HELD, file=path, then=then, trigger=",".join(sorted(due)))
        if self.timers.when(HELD) != until:
            self.timers.set(HELD, until, HELD)
        return until

    # -- wake-ups ---------------------------------------------------------------------

    def request_pass(self) -> None:
        """The gateway's thread: an OnDemand deployment was asked for, pass now."""
        with self._events:
            self._asked = True
        self._poke()

    def _hook_front(self, reconciler: Reconciler) -> None:
        if self.front is not None:
            reconciler.after_pass.append(_guarded(self.front.after_pass))
            reconciler.executor.launcher.drain = _guarded(self.front.drain)
            reconciler.executor.launcher.drains = GuardedDrains(self.front)

    def _fetch_done(self) -> None:  # the fetch's thread
        with self._events:
            self._fetch_ended = True
        self._poke()

    def _liveness_answered(self, news: bool) -> None:  # a probe's worker thread
        with self._events:
            self._probe_news |= news
            self._probes_moved = True
        self._poke()

    def _arm_probes(self) -> None:
        """The timer that starts the next liveness probes (a probe running re-arms it)."""
        due = self.liveness.next_due()
        if due is None:
            self.timers.cancel(PROBES)
        else:
            self.timers.after(PROBES, due + SLACK)

    def _poke(self) -> None:
        if self._wake_w < 0:  # closed: the daemon ends (a second SIGTERM, a late answer)
            return
        with contextlib.suppress(BlockingIOError):  # full: the loop is awake anyway
            os.write(self._wake_w, b"!")

    def _drain_wake(self) -> None:
        while True:
            try:
                if not os.read(self._wake_r, 4096):
                    break
            except BlockingIOError:
                break
        with self._events:
            changed, self._folder_event = self._folder_event, False
            whole, gone = self._settling.whole, self._settling.waiting
            asked, self._asked = self._asked, False
            news, self._probe_news = self._probe_news, False
            moved, self._probes_moved = self._probes_moved, False
            fetched, self._fetch_ended = self._fetch_ended, False
        if fetched:  # its pass moves the checkout to what it brought
            self.triggers.add(GIT_FETCH)
        if news:
            self.triggers.add("liveness")
        if moved:
            self._arm_probes()
        if asked:
            self.triggers.add("gateway")
        if self._signalled:
            self._signalled = False
            self.triggers.add("SIGUSR1")
        if changed:
            now = time.monotonic()
            if self._last_change is None or now - self._last_change >= DEBOUNCE:
                self._quiet_before = True
            self._last_change = now
            if gone:  # a deletion, or a folder come or gone: the full debounce, never at once
                self._quiet_before = False
            self._debounce(whole)

    def _folder_changed(self, kind: str, path: str) -> None:  # the watchdog thread
        with self._events:
            self._settling.note(kind, path)
            self._folder_event = True
        self._poke()

    def _debounce(self, whole: bool) -> None:
        """The pass after SETTLE once every changed file is whole, else after DEBOUNCE of
        quiet. The first change after a quiet spell, once whole, gets a pass at once,
        which applies only a plan of new starts (Reconciler.run_pass's ``at_once``): a
        new manifest's engine starts without the settle, while a stop, a replacement or
        any other change waits for it, as a multi-file edit may still be landing."""
        if whole and self._quiet_before:
            self._quiet_before = False
            self.triggers.add(AT_ONCE)
            return
        now = time.monotonic()
        if self._debounce_since is None:
            self._debounce_since = now
        if whole:  # pulls in an earlier, longer wait: the files it waited for are whole now
            when = min(now + SETTLE, self._debounce_since + DEBOUNCE_MAX)
        else:
            pending = self.timers.when("debounce")
            when = debounce_until(now, DEBOUNCE, pending, self._debounce_since, DEBOUNCE_MAX)
        self.timers.set("debounce", when, "folder")

    def _undisturbed(self) -> bool:
        """No folder event since the loop last looked (a pass run at once asks, once it
        read the manifests: a file begun meanwhile defers it)."""
        with self._events:
            return not self._folder_event and self._settling.whole

    def _unchanged(self, before: dict[str, Stamp]) -> bool:
        """No manifest changed since the pass began (``before``: their stamps then), and the
        watch saw none written: else the pass may have read a writer's prefix (one that
        truncated the file after the pass began: nothing held it), valid YAML declaring
        fewer deployments. Such a file is held as written (its close ends the hold). A
        file changed at every pass is read as it is after WRITE_HOLD_MAX, as a hold ends."""
        now = stamps(self.folders.folders)
        changed = sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
        with self._events:
            for path in changed:
                self._settling.suspect(path)
            changed = changed or sorted(self._settling.writing)
        if not changed:
            return True
        since = time.monotonic() if self._torn is None else self._torn[1]
        if time.monotonic() - since > WRITE_HOLD_MAX:
            return True
        if self._torn is None or self._torn[0] != changed[0]:
            log.info(TORN_READ, file=changed[0], then="read again once it is whole")
        self._torn = (changed[0], since)
        return False

    def _exited(self, name: str, ref: ProcessRef) -> None:
        status = self.reconciler.backend.exit_of(ref)  # reaps our child: no zombie
        code = None if status is None else status.code
        sig = None if status is None else status.signal
        log.info("engine exited", deployment=name, pid=ref.pid, code=code, signal=sig)
        self.triggers.add(f"exit {name}")

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        self.fetcher.give_up()  # a fetch is no round to finish: stopped (passes make none)
        self._poke()

    def _on_usr1(self, signum: int, frame: FrameType | None) -> None:
        """ "Pass now": what `reconcile restart` sends a daemon that serves no gateway (no
        lock taken in a handler: the loop may hold it; the wake-up pipe carries it)."""
        self._signalled = True
        self._poke()

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.reloading = True
        self._poke()

    def _reload(self) -> None:
        self.reloading = False
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            # New flags, node file and device inventory; the same backend: it holds the
            # engines we spawned (to reap them and know their exit codes).
            fresh = build_reconciler(
                self.reload_config(), self.reconciler.backend, self.store, self.reconciler
            )
        except ReconcileError as exc:
            log.error("reload failed; keeping the old configuration", error=str(exc))
            by = f"daemon pid {os.getpid()}"
            refused.refuse(self.config.state_dir, refused.NODE_CONFIG, str(exc), by)
            self._refused = str(exc)
        else:
            refused.clear(self.config.state_dir, refused.NODE_CONFIG)
            self._refused = None
            fresh.interrupted = self.reconciler.interrupted
            fresh.fetched_apart = True
            fresh.liveness = self.liveness
            fresh.executor.launcher.defer_stops = True
            fresh.executor.launcher.carry_stops(self.reconciler.executor.launcher)
            self._hook_front(fresh)
            fresh.after_pass.append(lambda result, seconds: self.webhooks.wake())
            self.webhooks.retarget(fresh.config.notify)
            self.reconciler, self.config = fresh, fresh.config
            _note_set(fresh.config)  # the labels a cron `--once` beside it must share
            log.info(
                "configuration reloaded",
                devices=[d.key for d in fresh.inventory.devices],
                labels=fresh.config.labels,
            )
        if self.front is not None:
            self.front.reload(self.config)  # the node file's gateway settings, re-read
        self._ready_sent = False
        self.triggers.add("sighup")

    # -- a pass -------------------------------------------------------------------------

    def _pass(self) -> None:
        triggers = sorted(self.triggers)
        self.triggers.clear()
        self.timers.cancel("debounce")
        self._debounce_since = None
        self._quiet_before = False  # a change after this pass is at once only after quiet
        with self._events:  # the pass reads the folders as they are now
            self._settling = Settling()
        before = stamps(self.folders.folders)
        self.folders.rearm()  # before the pass reads the folders: no event falls in between
        at_once = self._undisturbed if triggers == [AT_ONCE] else None
        # A git source's checkout is moved by the pass itself, and written by no one else.
        unchanged = None if self.config.git is not None else lambda: self._unchanged(before)
        if self._state_dir_gone():
            gone = f"state dir {self.config.state_dir} removed or replaced"
            self._tell(f"pass refused: {gone}")
            self.timers.after("resync", self.resync, "resync")
            return
        self._open_front()
        started = time.monotonic()
        began = (datetime.now(UTC), bootclock.read())  # before the plan reads its clocks
        try:
            result = self.reconciler.run_pass(
                lock_timeout=LOCK_WAIT, at_once=at_once, unchanged=unchanged
            )
        except LockTimeout as exc:
            self._say("lock", "pass waits: another pass holds the lock", reason=str(exc))
            self._tell(f"pass waits: {exc}")
            self.triggers.clear()
            self.timers.after("retry", LOCK_RETRY, ",".join(triggers))
            return
        except BackendUnavailable as exc:
            self._unreachable(str(exc))
            self._tell(f"pass failed: the cluster does not answer: {exc}")
            self.timers.after("resync", self.resync, "resync")
            return
        except StateDirReplaced as exc:  # said once; each resync looks again
            emit = log.debug if self._said.get("replaced") == str(exc) else log.error
            emit("pass refused", reason=str(exc), trigger=",".join(triggers))
            self._said["replaced"] = str(exc)
            self._tell(f"pass refused: {exc}")
            self.timers.after("resync", self.resync, "resync")
            return
        except OSError as exc:  # ENOSPC, EIO, EACCES on the state dir: the pass stopped there
            why = _io_next(exc.errno)
            log.error("pass failed", trigger=",".join(triggers), error=str(exc), next=why)
            self._said["io"] = str(exc)  # the pass that goes through again says so
            self._tell(f"pass failed: {exc}")
            self.timers.after("resync", self.resync, "resync")
            return
        except ReconcileError as exc:
            log.error("pass failed", trigger=",".join(triggers), error=str(exc))
            self._tell(f"pass failed: {exc}")
            self.timers.after("resync", self.resync, "resync")
            return
        self._said.pop("lock", None)
        if self._said.pop("replaced", None) is not None:
            log.info("passes go through again", after="no engine of another state dir runs")
        if self._said.pop("io", None) is not None:
            log.info("passes go through again", after=",".join(triggers))
        if self._said.pop("unreachable", None) is not None:
            log.info("the cluster answers again")
        if result.deferred:  # it did nothing: the settle's pass follows
            log.debug("pass deferred until the manifests folder settles", trigger=triggers[0])
            with self._events:
                whole = self._settling.whole
            self._debounce(whole)
            return
        if self.stopping and not result.records:  # the stop came before its first round
            log.info("pass given up: the daemon stops", trigger=",".join(triggers))
            return  # not `pass N` with no action, nor READY=1 `0/N ready`: it looked at nothing
        self._torn = None
        self.passes += 1
        took = round(time.monotonic() - started, 3)
        # what each pass plans again while it waits (its record says it, once): no change
        waits = Hold | Conflict | HoldChange
        changes = [a.verb for a in result.actions if not isinstance(a, waits)]
        timed = set(triggers) <= TIMED  # a quiet resync or probe: debug, not every 5 s
        emit = log.debug if timed and not changes else log.info
        emit("pass", n=self.passes, trigger=",".join(triggers), took=took, actions=changes)
        self._after(result, began)

    def _state_dir_gone(self) -> bool:
        """The state dir removed or replaced under the daemon (its disk unmounted, an ``rm
        -rf``): the daemon lock held is no longer the file at its path. A pass made the
        folder afresh, found no record and stopped every engine as one no record accounts
        for; none runs until the state dir is back (said once, and its return)."""
        self._follow_the_engines_dir()
        if self.lock is None or self.lock.still_at_path():
            if self._said.pop("state dir", None) is not None:
                log.info("passes go through again", after="the state dir is back")
            return False
        if "state dir" not in self._said:
            self._said["state dir"] = "gone"
            log.error(
                "pass refused",
                reason=f"the state dir {self.config.state_dir} was removed or replaced while "
                f"the daemon ran ({self.lock.path} is not the file it locked): a pass would "
                "find no record and stop every engine it runs",
                next="the engines run on, untouched: put the state dir back (mount its disk "
                "again) and passes resume; to start afresh on this one, `reconcile down` of "
                "its manifest set stops them, then restart the daemon",
            )
        return True

    def _open_front(self) -> None:
        """Start (or adopt) the gateway, but not while engines of another state dir run at
        this path (``replaced.py``): a gateway started on that folder asked theirs, which
        no file of it names, to stop, and answered each request `model_not_found` while
        the engines ran on. Theirs serves on meanwhile; once they are this dir's (it is
        back), it is adopted or handed over as at any start."""
        if self.front is None or self._front_open:
            return
        if self.reconciler.backend.strangers():
            why = "engines of another state dir run at this path (see `pass refused`)"
            self._say("front", "gateway not started", why=why, next=FRONT_HELD)
            return
        self.front.start(self.request_pass)
        self._front_open = True
        self._said.pop("front", None)

    def _follow_the_engines_dir(self) -> None:
        """A daemon whose passes were refused as its engines' state dir was elsewhere
        (``replaced.py``: started on an emptied one) did nothing in the one it locked:
        once another is at the path (the engines' own, mounted again), it takes that one's
        lock, and its next pass judges the engines by that one's id."""
        lock = self.lock
        if lock is None or lock.still_at_path() or "replaced" not in self._said:
            return
        if lock.take_again():
            log.info("the state dir was replaced while passes were refused: its lock taken")
            _note_set(self.config)  # `restart`, `down` and `status` read it there

    def _unreachable(self, why: str) -> None:
        """The cluster's head does not answer: the pass moved nothing; its records say
        their state is unknown (unreachable.py), and the daemon serves on."""
        self._say("unreachable", "pass failed: the cluster does not answer", reason=why)
        try:
            rc = self.reconciler
            unreachable.mark(rc.store, rc.pass_lock, self.config.owner, why, LOCK_WAIT)
        except (LockTimeout, OSError) as exc:  # a cron pass holds it: the next try marks
            log.debug("records not marked unknown", error=str(exc))

    def _after(self, result: PassResult, began: tuple[datetime, BootClock | None]) -> None:
        self._report(result)
        self.timers.after("resync", self.resync, "resync")
        self._arm_records(result.ours(), began)
        self._arm_git()
        # pidfds watch local engines only: a cluster engine's pid is on another machine (its
        # actor restarts it there; the resync timer's pass records what happened).
        watchable = self.reconciler.backend.exits_watchable
        watched = {
            r.name: r.ref
            for r in result.ours()
            if watchable and r.ref and r.phase in WATCHED and not r.on_cluster
        }
        self.exits.sync(watched)
        self._arm_liveness()
        self._arm_probes()
        if self.reconciler.autoscaler.policies:
            self.timers.after("autoscale", AUTOSCALE_PERIOD)
        else:
            self.timers.cancel("autoscale")
        ready = sum(r.phase is Phase.READY for r in result.ours())
        status = f"pass {self.passes}: {ready}/{len(result.ours())} ready"
        if self._refused:  # systemd takes any READY=1 for a reload done: `status` says not
            status += f"; reload refused, the configuration before it kept: {self._refused}"
        self._tell(status)

    def _tell(self, status: str) -> None:
        """READY=1 with the first pass, whether it went through or not (a lock held, the
        state dir gone or full, the cluster away): the daemon is up and tries again by
        itself, but systemd, still waiting for READY=1 (at a start, or after a reload's
        RELOADING=1), killed it at TimeoutStartSec and started it again, each start failed.
        STATUS= (`systemctl status`) says how the last pass went, once per change."""
        status = status_field(status)
        if not self._ready_sent:
            self._ready_sent = self.notifier.send("READY=1", status)
        elif status != self._status:
            self.notifier.send(status)
        self._status = status

    def _arm_git(self) -> None:
        """The next fetch when it is due: the interval (or a retry's back-off), not every
        resync; a webhook's pass brings it forward. None while one is in flight: its end
        asks for a pass, which arms the next."""
        git = self.reconciler.git
        self._arm_move(git)
        if git is None or self.fetcher.busy:
            self.timers.cancel(GIT_FETCH)
            if git is not None and self._pin_waits(git):  # a rollback never waits on a fetch
                self.fetcher.make_way()
            return
        try:
            due = git.due_in()
        except ReconcileError as exc:
            log.error("git source status unreadable", error=str(exc))
            due = self.resync
        if self.fetcher.failed is not None:  # it could not even begin: no loop of tries
            due = max(due, self.resync)
        self.timers.after(GIT_FETCH, due + SLACK, GIT_FETCH)

    def _arm_move(self, git: GitSource | None) -> None:
        """A failed move is tried again when its back-off ends, by a pass of its own: the
        next resync or fetch may be an hour away (the fetch's back-off has its timer too)."""
        try:
            due = None if git is None else git.move_due_in()
        except ReconcileError as exc:
            log.error("git source status unreadable", error=str(exc))
            due = None
        if due is None:
            self.timers.cancel(GIT_MOVE)
        else:
            self.timers.after(GIT_MOVE, due + SLACK, GIT_MOVE)

    @staticmethod
    def _pin_waits(git: GitSource) -> bool:
        try:
            return git.pin_waits()
        except ReconcileError as exc:
            log.error("git source status unreadable", error=str(exc))
            return False

    def _fetch(self) -> None:
        """A fetch due: on its own thread, beside the passes (gitfetch.py)."""
        if self.reconciler.git is not None and not self.stopping:
            self.fetcher.start(self.reconciler.git)

    def _arm_records(self, records: list[Record], began: tuple[datetime, BootClock | None]) -> None:
        """A pass when the next probe is due, a deadline passes, a back-off ends or an
        idleTimeout runs out (``began``: the clocks when the pass that left ``records``
        began)."""
        self.timers.cancel_prefix("record:")
        now_wall = datetime.now(UTC)
        # Peeked: only a pass sets a file aside (documents.py), and this runs outside the
        # pass lock; a torn file is a request at its mtime either way.
        demand = activation.read_all(self.config.state_dir, peek=True)
        for rec in records:
            due = _next_due(rec, now_wall) or _idle_due(rec, demand, *began)
            if due is not None:
                self.timers.after(f"record:{rec.name}", due[1], due[0])

    def _autoscale(self) -> None:
        """Between passes: a pass as soon as the load changes an autoscaled count."""
        try:
            due = self.reconciler.autoscaler.due(self.store.load().records.values(), time.time())
        except (OSError, ReconcileError) as exc:
            log.error("autoscaler check failed", error=str(exc))
            due = False
        if due:
            self.triggers.add("autoscale")
        else:
            self.timers.after("autoscale", AUTOSCALE_PERIOD)

    def _arm_liveness(self) -> None:
        if self.exits.polling and not self.timers.armed("liveness"):
            self.timers.after("liveness", FALLBACK_PERIOD)

    def _report(self, result: PassResult) -> None:
        errors = "; ".join(str(e) for e in result.errors)
        self._say("errors", "manifests invalid", errors=errors)
        # A quarantined record names where it went; an unknown version, how to recover.
        problems = "; ".join(p.message for p in result.problems)
        self._say("records", "records unreadable", problems=problems)
        self._say(
            "prune",
            "pruning nothing (use --allow-empty to prune)",
            reason="" if result.unfetched else _prune_reason(result),
        )

    def _say(self, key: str, event: str, **fields: str) -> None:
        """Log a warning once per change, not once per pass; empty fields: all clear."""
        text = repr(sorted(fields.items()))
        if not any(fields.values()):
            self._said.pop(key, None)
        elif self._said.get(key) != text:
            self._said[key] = text
            log.warning(event, **fields)

    def _shutdown(self) -> None:
        self.notifier.send("STOPPING=1")
        self.fetcher.close()  # stopped by _on_stop: no git is left running
        self.webhooks.stop()
        if self.front is not None:
            self.front.stop()
        self.folders.stop()
        self.exits.close()
        self.liveness.close()
        self.selector.close()
        signal.set_wakeup_fd(-1)  # before its close: no signal writes to a reused number
        # Nor a handler: a second SIGTERM here wrote to the closed fd (EBADF: a traceback
        # and exit 1), or to whatever file took its number since.
        wake_w, self._wake_w = self._wake_w, -1
        os.close(self._wake_r)
        os.close(wake_w)
        failpoints.hit("daemon.shutdown.closed")
        log.info("daemon stopped; engines left running", passes=self.passes)


def _prune_reason(result: PassResult) -> str:
    """Why nothing was pruned, less what "manifests invalid" said: an unusable -f (a
    script, a binary) is one of its errors, with the next move, and was logged twice."""
    if not result.prune_blocked or not result.missing_folders:
        return result.prune_blocked or ""
    return "; ".join(result.folder_errors)


def _next_due(rec: Record, now: datetime) -> tuple[str, float] | None:
    """Why and in how many seconds a record needs the next pass (None: only on events)."""
    if rec.phase is Phase.BACKOFF and rec.backoff_until is not None:
        # never past the back-off's length from now: the wall clock may have stepped back
        longest = backoff(max(rec.restarts, 1)) + SLACK
        left = min(_until(rec.backoff_until, now), longest)
        if left <= SLACK:  # over, yet a pass left it backing off: held (drain, a device's
            return ("back-off held", HELD_RECHECK)  # turn); a look each second, no spin
        return ("back-off over", left)
    if rec.phase is Phase.STARTING and rec.ref is not None:
        period = rec.probe.period_seconds
        if rec.ready_deadline_at is not None:
            left = _until(rec.ready_deadline_at, now)
            # Past by the wall clock yet still Starting: the clock stepped forward and the
            # engine's age decides (planner); the probe period paces, not a busy loop.
            if SLACK < left < period:
                return ("readiness deadline", left)
        return ("probe due", period)
    if rec.phase is Phase.TERMINATING and rec.backoff_until is not None:
        left = _until(rec.backoff_until, now)  # a deferred stop's grace: SIGKILL then
        # Over, yet a pass left it Terminating (an engine not proven ours, kept): the
        # resync tries again, as for any stop refused; no pass a millisecond.
        return None if left <= SLACK else ("grace over", left)
    if rec.phase is Phase.PULLING:  # the pull's worker outlives passes: look for its end
        return ("pull progress", PULL_RECHECK)
    return None


def _idle_due(
    rec: Record, demand: dict[str, Activation], began: datetime, clock: BootClock | None
) -> tuple[str, float] | None:
    """An OnDemand engine: a pass when its idleTimeout runs out, counted as the planner
    counts it (the boot clock where the gateway stamped it) from when the pass that left
    ``rec`` holding ``began`` (its wall and boot ``clock``).

    None once the timeout was out (or no request ever came) when that pass began: it
    planned the park, so an engine still holding is held there (its manifest broken and
    kept running, a prune blocked, a stop refused), and a pass at once would hold it
    again: a wake-up loop of passes, hundreds a second. Events and the resync look
    again; a new request writes its demand and asks for a pass itself.
    """
    idle = rec.idle_timeout
    if not rec.on_demand or not rec.holds or idle is None:
        return None
    act = demand.get(base_name(rec.name))  # a rolling `@next` is asked for by its name
    left = None if act is None else idle - act.idle_for(began, clock)
    return None if left is None or left <= 0 else ("idle timeout", left + SLACK)


def _guarded(hook: Callable[P, None]) -> Callable[P, None]:
    """A gateway fault never stops a pass (nor a teardown: an undrained stop still stops)."""

    def call(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as exc:
            log.error("gateway hook failed", error=str(exc) or type(exc).__name__)

    return call


class GuardedDrains:
    """The gateway's drains for the deferred stops (``Launcher.begin``): a gateway fault
    is said and the stop goes on undrained, as ``_guarded``'s."""

    def __init__(self, front: FrontDoor) -> None:
        self.front = front

    def ask_drain(self, old: Record, new: Record | None) -> bool:
        return self._guard(lambda: self.front.ask_drain(old, new), False)

    def drain_answered(self, old: Record) -> bool:
        return self._guard(lambda: self.front.drain_answered(old), True)

    def end_drain(self, old: Record) -> None:
        self._guard(lambda: self.front.end_drain(old), None)

    def resume_drain(self, old: Record) -> bool:
        return self._guard(lambda: self.front.resume_drain(old), False)

    @staticmethod
    def _guard(call: Callable[[], T], fault: T) -> T:
        try:
            return call()
        except Exception as exc:
            log.error("gateway drain failed", error=str(exc) or type(exc).__name__)
            return fault


def _until(when: datetime, now: datetime) -> float:
    return max((when - now).total_seconds(), 0.0) + SLACK


def build_reconciler(
    config: Config, backend: Backend, store: RecordStore, before: Reconciler | None = None
) -> Reconciler:
    """``before``: the reconciler a reload replaces (its metrics counters run on)."""
    inventory = inventory_for(config)
    hooks = []
    if config.metrics_file or config.metrics_port:  # prometheus-client brings ssl: only then
        from controller.daemon.metrics import exporters

        hooks = exporters(config, inventory, before.after_pass if before is not None else ())
    # A git source fetches at its first pass, then when due (gitsource.GitSource.sync).
    return Reconciler(config, backend, inventory, hooks, store)


def _held(pid: int | None, config: Config) -> str:
    """Why a second daemon does not run on the state dir, and the move."""
    held = (
        f"another reconcile daemon (pid {pid or '?'}) already runs on state dir {config.state_dir}"
    )
    facts = procstat.stat(pid) if pid else None
    if facts is not None and facts.state in ("T", "t"):
        # A SIGTERM waits until the process runs again: `kill N` alone did nothing (systemd
        # sends SIGCONT after it).
        return (
            f"{held}, stopped (SIGSTOP, a debugger): stop it first (systemctl stop reconcile, "
            f"or kill {pid} && kill -CONT {pid}: a SIGTERM waits until it runs again), "
            "or give this one another --state-dir"
        )
    return (
        f"{held}: stop it first (systemctl stop reconcile, or kill {pid or 'it'}), "
        "or give this one another --state-dir"
    )


def run_daemon(
    config: Config,
    *,
    resync: float = 5.0,
    reload: Reload | None = None,
    front: FrontDoor | None = None,
    metrics_at: tuple[str, int] | None = None,
) -> int:
    """Run the loop until SIGTERM/SIGINT; ``reload`` re-reads the configuration on SIGHUP.

    ``metrics_at`` (host, port) serves ``/metrics``, bound only once the daemon lock is
    ours: a second daemon must say "another daemon runs", not "port in use".
    """
    if resync <= 0:
        raise ConfigError(f"--resync must be more than 0 seconds, not {resync:g}")
    store = RecordStore(config.state_dir)
    store.ensure()
    lock = FileLock(StateDir(config.state_dir).daemon_lock, what="daemon lock")
    if not lock.try_acquire():
        raise ConfigError(_held(lock.holder(), config))
    try:
        accesstoken.ensure(config.state_dir)  # the page's and /metrics': `reconcile ui` reads it
        # `restart` and `down` act or warn for this set's deployments only
        _note_set(config)
        server = None
        if metrics_at:
            from controller.daemon.metricsserver import serve  # http.server: only then

            server = serve(*metrics_at, config.state_dir)
        try:
            daemon = Daemon(
                config, resync=resync, reload=reload, front=front, store=store, lock=lock
            )
            return daemon.run()
        finally:
            if server is not None:
                server.shutdown()
    finally:
        lock.release()


def _note_set(config: Config) -> None:
    """Which set the daemon runs, with which labels, inventory and record version
    (``side/daemonset.py``): `restart` and `down` act or warn for this set's deployments
    only, a `--once` beside it refuses labels it has not loaded (each pass would undo the
    other's share) and to write records it cannot read, and `status` judges the devices
    engines hold by this inventory, not its shell's."""
    devices = daemonset.DaemonDevices(static=config.devices)
    running = daemonset.DaemonSet(
        pid=os.getpid(),
        owner=config.owner,
        labels=config.labels,
        devices=devices,
        records=NEWEST_VERSION,  # the newest it reads
    )
    daemonset.note(config.state_dir, running)


def _import_yaml() -> None:
    importlib.import_module("controller.store.sources.yamlread")
