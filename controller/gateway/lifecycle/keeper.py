"""The daemon's side of the gateway process: the ``FrontDoor`` the CLI injects.

The gateway is a process of its own (``process.py``) that outlives the daemon, as
engines do. The keeper, in the daemon:

- ``start``: adopts the live gateway of this state dir when it is ours to the letter
  (same version, settings and build: ``registry.fingerprint``) and has it re-read its key file
  and TLS pair (a SIGHUP: the files may have changed since), else starts one, which
  takes the port over from the one before (an upgrade or changed flags fail no request);
- watches it (a pidfd, on a thread of its own) and restarts it at once when it
  crashed (it left its member file behind); a gateway that exited cleanly without a
  successor was stopped on purpose (``reconcile gateway stop``) and stays stopped
  until SIGHUP or the next daemon (one `gateway restart` started meanwhile is followed);
  one that handed over is followed to its successor. Each start is made under
  ``registry.start_lock`` and none while ``gateway/stopped`` says a stop was asked, so
  the operator's stop wins over a restart under way or due;
- turns the gateway's wake-ups (a datagram on ``<state>/gateway/daemon.sock``) into
  ``request_pass``;
- ``ask_drain``, ``drain_answered``, ``end_drain``: the daemon's deferred stops' drain
  (``launcher.py`` ``begin``), asked, looked at by each pass and never waited for: an
  answer asks for a pass;
- ``drain``: ``registry.drain`` (the CLI's stops call it too): asks every live gateway
  to retire an engine (``retire/``) and waits for each one's answer (bounded by the
  engine's grace period), woken by the watch of ``retire/`` (``store/watch.py``,
  inotify) or every ``registry.DRAIN_RESYNC`` seconds (a gateway that died meanwhile
  answers nothing);
- ``reload`` (SIGHUP): settings that changed with the node file (its ``tlsCert``/``tlsKey``,
  ``logMaxBytes``/``logMaxFiles``) are checked as at start and handed to a new gateway
  that takes the port over (a bad one is refused, the gateway serves on as it was);
  else forwards SIGHUP (the gateway re-reads its key file and TLS pair);
- ``metrics``: the gateway's metrics (asked, else its file) and whether it answered, for
  ``/metrics`` and the textfile;
- ``stop``: leaves the gateway running (SIGTERM of the daemon stops the daemon only).

Stdlib and watchdog only (the daemon has it for its folders): no HTTP stack here.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from controller import __version__
from controller.core.state import Phase
from controller.errors import ConfigError, LockTimeout
from controller.gateway.lifecycle import registry
from controller.gateway.lifecycle.handover import Scraped, scrape
from controller.gateway.settings import Settings, said, settings_from_json, settings_to_json
from controller.logsetup import get_logger
from controller.store.instances.records import RecordStore
from controller.store.side import refused
from controller.store.statedir import StateDir

if TYPE_CHECKING:
    from controller.core.state import Record
    from controller.reconciler.run import PassResult
    from controller.store.config.node import Config
    from controller.store.watch import FolderWatch

log = get_logger("reconcile")

START_WAIT = 20.0  # seconds a new gateway process may take to serve (imports, bind)
STOP_WINS = "--stop-wins"  # the gateway's flag: a stop asked since its start was decided wins
WATCH_PERIOD = 1.0  # seconds between the thread's looks while no gateway is watched
PIDFD_RESYNC = 60.0  # ... while its pidfd is: its exit wakes the thread, this is a safety net
NO_PIDFD_PERIOD = 0.1  # ... when the kernel gives no pidfd: liveness by /proc
QUICK_DEATH = 10.0  # a gateway that dies this soon after its start backs off before the next
BACKOFF_MAX = 30.0
# Never passed to the gateway: an engine's marker (a sweep would take it for an engine) and
# the service's notify and watchdog variables (it is not the unit's main process).
NOT_INHERITED = frozenset(
    {"RECONCILE_INSTANCE", "NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "LISTEN_PID",
     "LISTEN_FDS", "LISTEN_FDNAMES"}
)  # fmt: skip


Settle = Callable[["Config"], Settings]  # the settings a configuration asks (the CLI's)


class GatewayLost(ConfigError):
    """A gateway that went while it started, for no fault of its settings: it died
    without an answer (``kill -9``, the OOM killer) or said ``ready`` and another took
    the port over since (``reconcile gateway restart``). ``proc`` is left to reap."""

    def __init__(self, message: str, proc: subprocess.Popen[bytes], nonce: str) -> None:
        super().__init__(message)
        self.proc = proc
        self.nonce = nonce


class Keeper:
    def __init__(self, settings: Settings, settle: Settle | None = None) -> None:
        self.settings = settings
        self._settle = settle  # None: the settings never change (tests' keepers)
        # SIGHUP changed them and no gateway serves them yet: a new one is to take the port
        # over (``_handover``: the thread is asked to now; left set if it did not start).
        self._unapplied = False
        self._handover = False
        self.state_dir = settings.state_dir
        self.fingerprint = registry.fingerprint(settings_to_json(settings), __version__)
        self._request_pass: Callable[[], None] = lambda: None
        self._watched: registry.GatewayInfo | None = None
        self._children: list[subprocess.Popen[bytes]] = []
        self._wake: socket.socket | None = None
        self._wake_at = ""
        self._refused: set[int | None] = set()  # uids whose wake-ups were ignored (said once)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._poke_r, self._poke_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._want = True  # False once it was stopped on purpose (until SIGHUP)
        self._retry_at = 0.0
        self._failures = 0
        self._mark_pass = False  # a gateway started since the last pass: tell it of the next
        self._answers = threading.Condition()  # retire/'s watch: a gateway answered a drain
        self._answered = 0  # answers seen by the watch so far (drains wait for a change)
        self._retire_watch: FolderWatch | None = None
        # The drains asked and not yet ended (``ask_drain``): nonce -> the gateways asked.
        self._asked: dict[str, list[registry.GatewayInfo]] = {}

    # -- FrontDoor ---------------------------------------------------------------------

    def start(self, request_pass: Callable[[], None]) -> None:
        """Adopt or start the gateway (a failure to serve is a ConfigError here)."""
        self._request_pass = request_pass
        registry.ensure(self.state_dir)
        registry.clear_stopped(self.state_dir)  # the next daemon starts it (README)
        # A drain that a daemon before this one asked of an engine still Terminating is
        # this one's first pass's to finish (``Launcher._resume_drain``); others are void.
        registry.clear_retires(self.state_dir, keep=_terminating(self.state_dir))
        from controller.store.watch import FolderWatch  # the daemon's, not the CLI's import

        self._retire_watch = FolderWatch(
            (StateDir(self.state_dir).retire,),
            self._answer_seen,
            wanted=lambda path: path.suffix == ".done",
        )
        self._retire_watch.start()
        self._bind_wake()
        found = registry.current_live(self.state_dir)
        if found is not None and found.fingerprint == self.fingerprint:
            self._watched = found
            # Same flags, not the same files: this daemon checked the key file and TLS
            # pair on disk now, and a restart is how many apply an edit (a key revoked,
            # a certificate renewed). The gateway re-reads both, as at a SIGHUP.
            registry.signal_gateway(found, signal.SIGHUP)
            log.info("gateway adopted", pid=found.ref.pid, address=found.address)
        else:
            try:
                self._watched = self._spawn(replacing=found)
            except GatewayLost as exc:  # no reason to fail the daemon: the thread goes on
                self._lost(exc, found)
        # What it serves was read now, and it serves.
        refused.clear(self.state_dir, refused.GATEWAY_SETTINGS, refused.GATEWAY_START)
        self._thread = threading.Thread(target=self._run, name="gateway-keeper", daemon=True)
        self._thread.start()

    def after_pass(self, result: PassResult, seconds: float) -> None:
        if self._mark_pass:
            self._mark_pass = False
            registry.mark_passed(self.state_dir)

    def drain(self, old: Record, new: Record | None) -> None:
        """Every live gateway routes nothing more to ``old`` (``new`` takes its requests)
        and answers once its requests to it ended, or its grace period ran out."""
        if self._retire_watch is not None:
            self._retire_watch.rearm()  # retire/ made again, or a dead watch thread
        with self._answers:
            seen = self._answered  # before asking: an answer given at once still wakes us

        def wait(timeout: float) -> None:
            nonlocal seen
            seen = self._next_answer(seen, timeout)

        if not registry.drain(self.state_dir, old, new, wait):
            log.warning("gateway drain not answered in time", deployment=old.name)

    def ask_drain(self, old: Record, new: Record | None) -> bool:
        """``drain``'s ask, not waited for (the daemon's deferred stops): every live
        gateway routes nothing more to ``old``; each answer asks for a pass, which looks
        (``drain_answered``). False: no gateway serves, nothing to wait for."""
        if self._retire_watch is not None:
            self._retire_watch.rearm()
        asked = registry.ask_drain(self.state_dir, old, new)
        if asked and old.nonce is not None:
            self._asked[old.nonce] = asked
        return bool(asked)

    def drain_answered(self, old: Record) -> bool:
        """Every gateway ``ask_drain`` asked of ``old`` answered, or is gone."""
        asked = self._asked.get(old.nonce or "", [])
        return registry.drain_answered(self.state_dir, old.nonce or "", asked)

    def resume_drain(self, old: Record) -> bool:
        """A drain of ``old`` asked by a daemon before this one (killed before it ended):
        its ask stands in retire/, and the gateways serving now answer it. False: none
        stands (never asked, or its asker ended it and signalled the engine)."""
        if old.nonce is None or not registry.retire_asked(self.state_dir, old.nonce):
            return False
        if self._retire_watch is not None:
            self._retire_watch.rearm()
        self._asked[old.nonce] = registry.live(self.state_dir)
        return True

    def end_drain(self, old: Record) -> None:
        """The ask of ``old`` and its answers go (its engine is signalled now)."""
        if old.nonce is not None:
            self._asked.pop(old.nonce, None)
            registry.drop_retire(self.state_dir, old.nonce)

    def _next_answer(self, seen: int, timeout: float) -> int:
        """Wait until the watch saw an answer after the ``seen``-th (or ``timeout``)."""
        with self._answers:
            self._answers.wait_for(lambda: self._answered != seen, timeout)
            return self._answered

    def _answer_seen(self) -> None:
        """The watch's thread: an answer came; every waiting drain looks."""
        with self._answers:
            self._answered += 1
            self._answers.notify_all()
        self._request_pass()  # a deferred stop's drain may be over: its pass signals it

    def reload(self, config: Config | None = None) -> None:
        """SIGHUP: settings changed in ``config`` (node.yaml) go to a new gateway that
        takes the port over; else the gateway re-reads its key file and TLS pair. A
        stopped gateway starts again."""
        self._want = True
        registry.clear_stopped(self.state_dir)
        watched = self._watched
        if config is not None and self._resettle(config) and watched is not None:
            self._handover = True  # the keeper's thread starts it: a start takes seconds
            self._poke()
            return
        if watched is not None and registry.signal_gateway(watched, signal.SIGHUP):
            return
        self._retry_at = 0.0
        self._poke()

    def _resettle(self, config: Config) -> bool:
        """Take the settings ``config`` asks for if they changed and pass the checks a
        start makes; True while no gateway serves them yet."""
        if self._settle is None:
            return False
        try:
            fresh = self._settle(config)
            changed = _changed(self.settings, fresh)
            if changed:
                preflight(fresh)
        except ConfigError as exc:
            log.error(
                "gateway settings not changed; the gateway serves on with its own",
                error=str(exc),
            )
            self._refusal(str(exc))
            return False
        if not changed and not self._unapplied:
            refused.clear(self.state_dir, refused.GATEWAY_SETTINGS)  # they serve as read
        if changed:
            warn_out_of_date(fresh)
            self.settings = fresh
            self.fingerprint = registry.fingerprint(settings_to_json(fresh), __version__)
            self._unapplied = True
            log.info("gateway settings changed: a new gateway takes the port over", **changed)
        return self._unapplied

    def stop(self) -> None:
        """The daemon ends: the gateway serves on (Ready engines; OnDemand requests wait
        for the next daemon). Only ``reconcile gateway stop`` stops it."""
        self._stopping.set()
        self._poke()
        if self._retire_watch is not None:
            self._retire_watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=START_WAIT)
        refused.clear(self.state_dir, refused.GATEWAY_START)  # nobody tries again now
        if self._wake is not None:
            self._wake.close()
            registry.unlink_address(self._wake_at)
            registry.unpublish_wake(self.state_dir, self._wake_at)
        watched = self._watched
        if watched is not None:
            log.info("gateway left running", pid=watched.ref.pid, address=watched.address)

    def metrics(self) -> Scraped:
        """The serving gateway's metrics, asked now; its file when it does not answer
        (starting, handing over: at most half a second old; stopped, hung: as old as the
        ``at`` it comes with) or none is watched."""
        return scrape(self.state_dir, self._watched)

    # -- starting one ---------------------------------------------------------------------

    def _spawn(self, replacing: registry.GatewayInfo | None) -> registry.GatewayInfo | None:
        """A new gateway process, serving once this returns; it takes the port over.
        None when ``reconcile gateway stop`` asked for none (it wins, until SIGHUP)."""
        settings = self.settings  # read once: a SIGHUP may change them meanwhile
        try:
            with registry.start_lock(self.state_dir).hold(registry.START_LOCK_WAIT):
                if registry.stop_asked(self.state_dir):
                    self._stop_honoured()
                    return None
                proc, info = start_process(settings, stop_wins=True)
        except LockTimeout as exc:
            raise ConfigError(str(exc)) from None
        self._children.append(proc)
        self._mark_pass = True
        self._unapplied = self.settings != settings
        log.info(
            "gateway started",
            pid=proc.pid,
            address=info.address,
            replaced=replacing.ref.pid if replacing is not None else None,
        )
        return info

    def _follow_restarted(self) -> None:
        """Left stopped, a gateway serves again: `reconcile gateway restart` started it
        (as `systemctl restart` starts a stopped unit). Watched from now: its crash is
        restarted, as any."""
        serving = registry.current_live(self.state_dir)
        if serving is None:
            return
        self._watched, self._want = serving, True
        self._follow_settings(serving)
        log.info("gateway started by `reconcile gateway restart`; watching it", pid=serving.ref.pid)

    def _stop_honoured(self) -> None:
        """A stop was asked while a start was due (a crash's restart, a hand-over)."""
        self._want = self._handover = False
        refused.clear(self.state_dir, refused.GATEWAY_START)  # nobody tries again now
        log.info(
            "gateway not started: `reconcile gateway stop` asked it stopped; `reconcile "
            "gateway restart`, SIGHUP to the daemon or its restart starts the gateway again"
        )

    def _lost(self, exc: GatewayLost, replacing: registry.GatewayInfo | None) -> None:
        """The gateway being started went (``GatewayLost``): follow another that took
        the port over; else have it replace ``replacing`` again if that one serves on;
        else start one after the back-off of a crash."""
        self._children.append(exc.proc)
        if exc.proc.poll() is not None:  # killed: what it left is a crash's
            registry.forget(self.state_dir, exc.nonce)
        serving = registry.current_live(self.state_dir)
        if serving is not None and (replacing is None or serving.nonce != replacing.nonce):
            self._watched = serving
            self._follow_settings(serving)
            log.info(
                "gateway replaced while it started; following the one serving now",
                error=str(exc),
                pid=serving.ref.pid,
            )
            return
        self._watched = serving
        self._failures += 1
        delay = min(BACKOFF_MAX, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + delay
        if serving is not None:
            self._handover = True  # the keeper's thread tries again
            log.warning("gateway ended while it started; the old one serves on", error=str(exc))
            return
        log.warning("gateway ended while it started; restarting it", error=str(exc), after=delay)

    def _bind_wake(self) -> None:
        """The wake-up socket: its path, or a random abstract name written down in the
        state dir (a name derived from the path could be taken first by anyone)."""
        address = registry.fresh_address(
            self.state_dir, StateDir(self.state_dir).daemon_socket.name
        )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        registry.unlink_address(address)  # an earlier daemon's (we hold the lock now)
        try:
            registry.pass_credentials(sock)
            sock.bind(address)
            registry.publish_wake(self.state_dir, address)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"gateway wake-up socket {address!r}: {exc}") from exc
        sock.setblocking(False)
        self._wake, self._wake_at = sock, address

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        pidfd: tuple[str, int] | None = None  # (nonce, fd) of the watched gateway
        try:
            while not self._stopping.is_set():
                watched = self._watched
                if pidfd is not None and (watched is None or pidfd[0] != watched.nonce):
                    os.close(pidfd[1])
                    pidfd = None
                if watched is not None and pidfd is None:
                    fd = _pidfd(watched)
                    pidfd = (watched.nonce, fd) if fd is not None else None
                fds = [self._poke_r] + ([self._wake.fileno()] if self._wake else [])
                fds += [pidfd[1]] if pidfd is not None else []
                ready, _, _ = select.select(fds, [], [], _period(watched, pidfd is not None))
                self._drain_pokes()
                if self._wake is not None and self._wake.fileno() in ready and self._drain_wakes():
                    self._request_pass()
                self._reap()
                if self._stopping.is_set():
                    break
                if watched is not None and not watched.alive():
                    self._gone(watched)
                elif watched is None:
                    self._maybe_start()
                elif self._handover:
                    self._replace(watched)
        finally:
            if pidfd is not None:
                os.close(pidfd[1])

    def _gone(self, info: registry.GatewayInfo) -> None:
        """The watched gateway ended: follow its successor, restart it, or let it be."""
        crashed = registry.crashed(self.state_dir, info.nonce)
        self._reap()
        # Followed even when it has ended too (a hand-over's old gateway drains for a
        # while; its successor may crash before this look): the next turn judges its end,
        # a crash restarted, and the old one's clean stop is no reason to leave it down.
        successor = registry.read_current(self.state_dir)
        if successor is not None and successor.nonce != info.nonce:
            self._watched = successor
            self._follow_settings(successor)
            log.info("gateway handed over", old_pid=info.ref.pid, pid=successor.ref.pid)
            return
        self._watched = None
        if not crashed:
            self._want = False
            log.info(
                "gateway stopped (not a crash): not restarting it; `reconcile gateway "
                "restart`, SIGHUP to the daemon or its restart starts the gateway again",
                pid=info.ref.pid,
            )
            return
        registry.forget(self.state_dir, info.nonce)
        quick = time.time() - info.started_at < QUICK_DEATH
        self._failures = self._failures + 1 if quick else 0
        delay = min(BACKOFF_MAX, 2.0 ** (self._failures - 1)) if self._failures else 0.0
        self._retry_at = time.monotonic() + delay
        log.warning("gateway exited unexpectedly; restarting it", pid=info.ref.pid, after=delay)
        self._maybe_start()

    def _follow_settings(self, successor: registry.GatewayInfo) -> None:
        """A hand-over we did not start (`reconcile gateway restart`, which read node.yaml
        again): its settings are the ones to restart it with after a crash, not those of
        this keeper's last look at node.yaml. One of another version is left as it is."""
        if successor.version != __version__ or successor.fingerprint == self.fingerprint:
            return
        try:
            settings = settings_from_json(successor.settings)
        except (KeyError, TypeError, ValueError):
            return
        self.settings, self.fingerprint = settings, successor.fingerprint
        self._unapplied = False

    def _replace(self, old: registry.GatewayInfo) -> None:
        """SIGHUP changed the settings: a new gateway with them takes the port over (no
        request fails, as at an upgrade); one that does not start leaves the old serving."""
        self._handover = False
        try:
            started = self._spawn(replacing=old)
        except ConfigError as exc:
            log.error(
                "gateway settings not applied: the new gateway did not start; the old one "
                "serves on with its own (SIGHUP to try again)",
                error=str(exc),
            )
            self._refusal(f"the gateway with them did not start: {exc}")
            return
        if started is None:  # a stop was asked: the old one stops, watched to its end
            return
        self._watched = started
        refused.clear(self.state_dir, refused.GATEWAY_SETTINGS)

    def _refusal(self, why: str) -> None:
        """Said where `status` looks, not in the log alone (an edit is not taken for applied)."""
        by = f"daemon pid {os.getpid()}"
        refused.refuse(self.state_dir, refused.GATEWAY_SETTINGS, why, by)

    def _maybe_start(self) -> None:
        if not self._want:
            self._follow_restarted()
            return
        if time.monotonic() < self._retry_at:
            return
        replacing = registry.current_live(self.state_dir)
        try:
            self._watched = self._spawn(replacing=replacing)
        except GatewayLost as exc:
            self._lost(exc, replacing)
            return
        except ConfigError as exc:
            self._failures += 1
            delay = min(BACKOFF_MAX, 2.0 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            log.error("gateway did not start; trying again", error=str(exc), after=delay)
            refused.refuse(
                self.state_dir, refused.GATEWAY_START, str(exc), f"daemon pid {os.getpid()}"
            )
            return
        if self._watched is None:  # a stop was asked meanwhile
            return
        refused.clear(self.state_dir, refused.GATEWAY_START)
        self._request_pass()  # its first records come with a pass it is told of

    def _reap(self) -> None:
        """Our gateway children that ended (a handed-over one, a crash): no zombie."""
        self._children = [p for p in self._children if p.poll() is None]

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._poke_w, b"!")

    def _drain_pokes(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._poke_r, 4096):
                pass

    def _drain_wakes(self) -> bool:
        """Read every wake-up waiting; True if one came from our uid or root (anyone
        may send to an abstract name: another user's flood asks for no pass)."""
        assert self._wake is not None
        asked = False
        with contextlib.suppress(BlockingIOError, OSError):
            while True:
                uid = registry.receive(self._wake)
                if registry.trusted(uid):
                    asked = True
                elif uid not in self._refused:
                    self._refused.add(uid)
                    log.warning("gateway wake-up from another user ignored", uid=uid)
        return asked


def preflight(settings: Settings) -> None:
    """What a start checks of the files the settings name (the key file, the TLS pair),
    so a bad one is said now, not by a gateway process that will not start."""
    from controller.gateway.accounting import keys
    from controller.gateway.lifecycle import tls

    if settings.api_keys is not None:
        keys.load(settings.api_keys)
    if settings.tls_cert is not None and settings.tls_key is not None:
        try:
            tls.server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        except tls.TlsError as exc:
            raise tls.as_named(exc, settings) from None


def warn_out_of_date(settings: Settings) -> None:
    """The warning for a certificate expired or not valid yet (it is served as given), and
    for a client CRL past its nextUpdate (every client of its CA is refused)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return
    from controller.gateway.lifecycle import tls, tlsdates

    dated = tlsdates.out_of_date(settings.tls_cert, settings.tls_key)
    if dated:
        log.warning("TLS certificate out of date", detail=tls.named(dated, settings))
    if settings.tls_client_ca is not None:
        tlsdates.warn_crl_out_of_date(settings.tls_client_ca)


def _changed(old: Settings, new: Settings) -> dict[str, str]:
    """Each setting that differs, as ``old -> new`` (paths and numbers: never a secret),
    under the name node.yaml gives it."""
    return {
        said(name): f"{getattr(old, name)} -> {getattr(new, name)}"
        for name in settings_to_json(new)
        if getattr(old, name) != getattr(new, name)
    }


def _state_id(state_dir: Path) -> str | None:
    """The state dir's id for its gateway to carry, made first where no pass made one yet
    (a daemon starts its gateway before its first pass; it starts none beside engines of
    another state dir at the path). None when it cannot be read or made: the passes say
    why, and the gateway is judged by its path alone, as before ids."""
    from controller.errors import ConfigError
    from controller.store.config import stateid

    try:
        return stateid.ensure(state_dir)
    except (OSError, ConfigError):
        return None


def start_process(
    settings: Settings, log_path: Path | None = None, *, stop_wins: bool = False
) -> tuple[subprocess.Popen[bytes], registry.GatewayInfo]:
    """Start a gateway process for ``settings``; it serves (and took the port over from
    the current one, if any) once this returns. A ConfigError says why it did not.

    Its log lines go to our stderr, or appended to ``log_path`` (a CLI verb's stderr
    is gone when the verb exits). ``stop_wins``: a start that looked for a stop asked
    (the keeper's, under the start lock) and found none: the gateway stops itself if it
    finds one once registered (``process.main``)."""
    nonce = os.urandom(8).hex()
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env[registry.MARKER] = f"{settings.node}/{nonce}"
    env.pop(registry.STATE_ID, None)  # a fact of ours, never the environment's word
    known = _state_id(settings.state_dir)
    if known is not None:  # another state dir's gateways at this path are told apart by it
        env[registry.STATE_ID] = known
    env[registry.READY_FD] = str(ready_w)
    data = json.dumps(settings_to_json(settings))
    argv = [sys.executable, "-m", "controller.gateway", "--settings", data, "--nonce", nonce]
    argv += [STOP_WINS] if stop_wins else []
    err = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if log_path else None
    try:
        # A session of its own: the daemon's group, terminal or unit stop never reaches
        # it; stderr is the starter's (the journal, a log file): one place for both.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd="/",
            pass_fds=(ready_w,),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(ready_r)
        raise ConfigError(f"cannot start the gateway process: {exc}") from exc
    finally:
        os.close(ready_w)
        if err is not None:
            os.close(err)
    try:
        answer = _read_answer(ready_r, START_WAIT)
    finally:
        os.close(ready_r)
    info = registry.read_current(settings.state_dir)
    if answer == "ready":
        if info is not None and info.nonce == nonce:
            return proc, info
        # It served, then another gateway took the port over from it (or stopped it):
        # that one serves now; ours drains what it holds and exits.
        holder = f"pid {info.ref.pid}" if info is not None else "none"
        message = f"gateway pid {proc.pid} was replaced as it started ({holder} serves)"
        raise GatewayLost(message, proc, nonce)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    code = proc.wait(timeout=START_WAIT)
    if not answer and code < 0:  # killed before it answered: no fault of the settings
        name = signal.Signals(-code).name
        message = f"gateway pid {proc.pid} was killed ({name}) as it started"
        raise GatewayLost(message, proc, nonce)
    why = answer.removeprefix("error: ") if answer else f"it exited with code {code}"
    raise ConfigError(why if why.startswith("--listen") else f"gateway: {why}")


def _read_answer(fd: int, timeout: float) -> str:
    """The starting gateway's one line: ``ready`` or ``error: ...`` ("" if it died)."""
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            return f"error: the gateway process did not answer within {timeout:g}s of its start"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _period(watched: registry.GatewayInfo | None, pidfd: bool) -> float:
    """How long the thread may sleep when nothing wakes it: a pidfd says when the gateway
    ends, a poke or a datagram when anything else is to do; without a gateway its next
    start is tried (after its back-off), without a pidfd its liveness is polled."""
    if pidfd:
        return PIDFD_RESYNC
    return WATCH_PERIOD if watched is None else NO_PIDFD_PERIOD


def _pidfd(info: registry.GatewayInfo) -> int | None:
    """A pidfd for the gateway, opened before its identity is checked (so it cannot
    name a reused pid); None without pidfds (then /proc is polled)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(info.ref.pid)
    except OSError:
        return None
    if not info.alive():
        os.close(fd)
        return None
    return fd


def _terminating(state_dir: Path) -> set[str]:
    """The nonces of the records Terminating in ``state_dir`` (a stop, maybe draining)."""
    records = RecordStore(state_dir).peek().records.values()
    return {r.nonce for r in records if r.phase is Phase.TERMINATING and r.nonce is not None}
