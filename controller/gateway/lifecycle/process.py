"""The gateway process: ``python -m controller.gateway --settings JSON --nonce N``.

Started by the daemon's keeper (``keeper.py``) or ``reconcile gateway restart``, in a
session of its own, so it outlives the daemon as engines do. It

1. takes the listening socket over from the gateway now current in the state dir
   (``handover.py``), or binds one (``SO_REUSEPORT``), refused when anything but a
   gateway of its own state dir listens on that port (``listener.bind_alone``);
2. serves (``app.Gateway``) with the records it reads from ``instances/``
   (``records_watch.py``), writes OnDemand activations as before and wakes the daemon
   for a pass through its datagram socket (nobody there: the next daemon's pass reads
   the activation);
3. registers itself (``registry``: ``gw-<nonce>.json``, then ``current.json``), tells
   the old gateway to stop accepting, and says ``ready`` on the pipe its starter gave;
4. honours the daemon's drains (``retire/``), writes its metrics text for the daemon's
   exporter, re-reads the key file and the TLS pair on SIGHUP (``tls.py``);
5. on SIGTERM, a successor's ``stop``, or (started by a daemon) a ``gateway stop`` asked
   since its start was decided: closes its listener, finishes what it holds
   (up to the drain grace; handed over, however long, unless a SIGTERM comes), removes
   its files and exits 0. A crash leaves its member
   file behind, which is how the keeper tells a crash (restart it) from a stop.

It ends by itself when its state dir is gone (nothing left to route).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import os
import signal
import socket
import sys
import threading
import time

from controller import __version__, logsetup
from controller.errors import ConfigError
from controller.gateway.lifecycle import handover, listener, registry, reloads
from controller.gateway.lifecycle.app import BACKLOG, Gateway, loop_name
from controller.gateway.lifecycle.handover import HANDED_OVER
from controller.gateway.records_watch import RESYNC, RecordsWatch
from controller.gateway.routing.table import FIRST_PASS_WAIT
from controller.gateway.settings import Settings, settings_from_json, settings_to_json
from controller.host.procs import identity
from controller.logsetup import get_logger
from controller.redact import redact_url
from controller.store.documents import write_atomic
from controller.store.side import refused
from controller.store.statedir import StateDir
from controller.store.watch import FolderWatch, visible

log = get_logger("reconcile")

METRICS_PERIOD = 0.5  # seconds: at most this often the metrics text for the file
METRICS_RESYNC = 30.0  # seconds: rendered this often though nothing said it changed
GUARD_PERIOD = 5.0  # seconds between looks at who else listens on the port
SETTLE = 0.1  # seconds from a watch event to the look (see _turns)
FIRST_PASS_LOOK = 1.0  # seconds between looks until the first pass (`passed` is not watched)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_LOOK = 0.2  # seconds between looks for a stop signal while the gateway drains
STOP_ASKED = "`reconcile gateway stop` asked as it started"


class GatewayProcess:
    def __init__(self, settings: Settings, nonce: str) -> None:
        self.settings = settings
        self.nonce = nonce
        self.state_dir = settings.state_dir
        self.started = time.time()
        self.gateway = Gateway(settings)
        self.watch = RecordsWatch(self.state_dir, settings.owner, settings.node)
        self.control: handover.Control | None = None
        self.reloads: reloads.Counter | None = None  # once registered: SIGHUPs answered
        self._wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._wake.setblocking(False)
        self._main = threading.main_thread().ident
        self._why = "SIGTERM"
        self._retiring: set[str] = set()  # nonces whose drain runs or ran here
        self._looking = asyncio.Lock()  # one read of the records at a time (look())
        self._routed = False  # the table has had its first records
        self._listening: tuple[str, frozenset[int]] = ("", frozenset())  # address, inode
        self._strangers: set[str] = set()  # listeners beside us on the port, named once
        self._changed = asyncio.Event()  # the folders' watch: look now
        # Replaced gateways whose final counters are not added yet (None: all are, and
        # what nobody will add was swept): see _inherit.
        self._predecessors: dict[str, registry.GatewayInfo] | None = {}

    # -- start --------------------------------------------------------------------

    def open(self) -> None:
        """Take over (or bind) and serve; register; let the old gateway go."""
        s = self.settings
        registry.ensure(self.state_dir)
        old = registry.current_live(self.state_dir)
        # Every gateway live now ends once we serve (the one we take over; one replaced
        # before it and still draining): each leaves its final counters for us.
        others = [*registry.live(self.state_dir), *([old] if old is not None else [])]
        before = {info.nonce: info for info in others if info.nonce != self.nonce}
        taken = None
        if old is not None and old.nonce != self.nonce and old.port == s.port:
            taken = handover.take(registry.control_of(self.state_dir, old), s.port)
        # Nothing handed over: bind here, refused where anyone else serves the port.
        sock = (
            taken.sock
            if taken is not None
            else listener.bind_alone(s.host, s.port, BACKLOG, s.state_dir)
        )
        self._listening = (sock.getsockname()[0], frozenset({os.fstat(sock.fileno()).st_ino}))
        try:
            # Accepting once registered and current (below): a client that heard /healthz
            # answer and asked `reconcile ui` was told no gateway ran (CI: failed).
            self.gateway.start(self.wake_daemon, sock, serving=False)
        except ConfigError:
            if taken is not None:
                taken.abandon()  # the old one serves on
            else:
                sock.close()
            raise
        ref = identity(os.getpid())
        if ref is None:
            raise ConfigError("the gateway cannot read its own process identity")
        data = settings_to_json(s)
        address = registry.fresh_address(self.state_dir, f"ctl-{self.nonce}.sock")
        info = registry.GatewayInfo(
            nonce=self.nonce,
            ref=ref,
            host=s.host,
            port=s.port,
            version=__version__,
            fingerprint=registry.fingerprint(data, __version__),
            settings=data,
            started_at=self.started,
            control=address,
            traces=redact_url(self.gateway.tracing.endpoint),  # a collector's password: not kept
        )
        registry.register(self.state_dir, info)
        self.reloads = reloads.Counter(self.state_dir, self.nonce)  # before it is current
        self.control = handover.Control(
            address, self.gateway.listener_fd, self.ask_stop, self.gateway.metrics_text
        )
        self.control.start()
        registry.make_current(self.state_dir, info)
        self.gateway.serve()
        self._predecessors = before  # their final counters, once they drained: _inherit
        # Its key file and TLS pair were read at its start: a refusal of an earlier
        # gateway's reload no longer holds.
        refused.clear(self.state_dir, refused.API_KEYS, refused.TLS_PAIR)
        self.gateway.spawn(self.poll())
        if taken is not None:
            taken.release()
        elif old is not None and old.nonce != self.nonce:
            # It would not hand over (or serves another port): it goes the plain way.
            registry.signal_gateway(old, signal.SIGTERM)
        self._end_unnamed()
        log.info(
            "gateway listening",
            address=info.address,
            pid=os.getpid(),
            api_keys=len(self.gateway.keys.digests) if self.gateway.keys else 0,
            took_over=old.ref.pid if old is not None else None,
            handed_over=taken is not None,
            tls=s.tls,
            loop=loop_name(self.gateway.loop),
        )

    def _end_unnamed(self) -> None:
        """Stop the gateways of this state dir on our port that no file of it names (a
        state dir restored from a backup older than them): each would serve on beside us,
        forever, with what the restore took from under it. Ours by the state dir its
        command line names; SIGTERM is a gateway's graceful stop (it drains and exits)."""
        named = {os.getpid(), *(info.ref.pid for info in registry.live(self.state_dir))}
        address = self._listening[0]
        for pid in listener.unnamed_gateways(self.state_dir, address, self.settings.port, named):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            log.warning(
                "gateway of this state dir that no file names asked to stop",
                pid=pid,
                why="its gateway/ files are gone (a state dir restored from an older copy?): "
                "it would serve beside this one, unwatched",
            )

    def wake_daemon(self) -> None:
        # Looked up each time: a daemon whose path is too long binds a new name at start.
        registry.wake_daemon(self._wake, registry.wake_address(self.state_dir))

    def ask_stop(self, why: str) -> None:
        """Any thread: end the main thread's wait (it runs the graceful stop)."""
        self._why = why
        if self._main is not None:
            signal.pthread_kill(self._main, signal.SIGTERM)

    # -- the loop's watch ------------------------------------------------------------

    async def poll(self) -> None:
        """Records, drains and metrics, on the gateway's loop: when the watch of
        ``instances/``, ``retire/`` and ``drain.json`` says something changed, else every
        RESYNC seconds (the metrics file then lags the control socket's answer by up to
        that), every METRICS_PERIOD while a replaced gateway's final counters are
        awaited. The metrics text is rendered only when it may have changed
        (``_metrics_moved``): an idle gateway's turn is a ``scandir``, a stat of the
        drain file and the port's guard, nothing more."""
        front = self.gateway.front
        assert front is not None
        front.table.catch_up = self.look  # a name it lacks: a record written since?
        loop = asyncio.get_running_loop()
        layout = StateDir(self.state_dir)
        watch = FolderWatch(
            (layout.instances, layout.retire, layout.root),
            lambda: self._wake_loop(loop),
            # Records and retire asks (not our acks); of the root, the drain alone.
            wanted=lambda path: (
                path == layout.drain
                or (path.parent != layout.root and visible(path) and path.suffix == ".json")
            ),
        )
        watch.start()  # armed before the first look: a record written before it is scanned
        try:
            await self._turns(watch)
        finally:
            watch.stop()

    def _wake_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The watch's thread: the loop looks now (a closed loop has nothing to look for)."""
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._changed.set)

    async def _turns(self, watch: FolderWatch) -> None:
        last_metrics, metrics_at, guard_at = "", 0.0, time.monotonic()
        rendered: int | None = None  # _metrics_moved at the last render
        while True:
            # Looked at every turn, not only when the listing fails: a listing that fails
            # otherwise keeps its last stamp (a gateway of a removed state dir once served
            # on, beside its successor on the port, with an empty table).
            if not self.state_dir.exists():
                log.warning("state dir gone: the gateway stops", state_dir=str(self.state_dir))
                self.ask_stop("state dir gone")
                return
            self._changed.clear()  # before the look: what changes during it wakes the next
            watch.rearm()
            await self.look()
            self._retire_asked()
            now = time.monotonic()
            self._inherit()
            moved = self._metrics_moved()
            if now - metrics_at >= METRICS_PERIOD and (
                moved is None or moved != rendered or now - metrics_at >= METRICS_RESYNC
            ):
                metrics_at, written = now, await self._write_metrics(last_metrics)
                if written is not None:  # else not written: tried again next turn
                    last_metrics, rendered = written, moved
            if now - guard_at >= GUARD_PERIOD:
                guard_at = now
                await self._guard_port()
            wait = RESYNC if self._routed else FIRST_PASS_LOOK
            if self._predecessors:  # their counters come when they exit: not 5 s late
                wait = min(wait, METRICS_PERIOD)
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: 3.11's wait_for returns the event's result
                # when the stop's cancel comes as a change sets it, and this loop ran on
                # for good under a stop that awaits it (`down --gateway` out of time).
                async with asyncio.timeout(wait):
                    await self._changed.wait()
                # A pass writes in bursts (many records; a recreate deletes the old record
                # and a later round writes the new one): one look for the burst, SETTLE
                # after its first event, never later than the old 100 ms poll looked.
                await asyncio.sleep(SETTLE)

    def _metrics_moved(self) -> int | None:
        """What says the metrics text changed: requests done and counters inherited
        (``GatewayMetrics.moves``); None while gauges move by themselves (requests in
        flight, engines' figures read)."""
        metrics = self.gateway.metrics
        if metrics.inflight or metrics.engines:
            return None
        return metrics.moves

    async def look(self) -> None:
        """The records into the table if the folder changed since the last look: each
        poll's turn, and a request for a name the table lacks (``status`` may show a
        record the last turn came too early for). One look at a time, in order."""
        front = self.gateway.front
        assert front is not None
        async with self._looking:
            stamp = self.watch.stamp()
            if stamp is None or (stamp == self.watch.seen and self._routed):
                return
            loop = asyncio.get_running_loop()
            records = await loop.run_in_executor(None, self.watch.read, stamp)
            # Before the first pass a fresh state dir holds no record of ours: wait for
            # the daemon's (bounded) instead of answering 404 for what it has not read.
            # One holding records of a newer reconcile is no fresh state dir.
            if (
                self._routed
                or records
                or self.watch.newer()
                or registry.passed_since(self.state_dir, self.started)
                or time.time() - self.started > FIRST_PASS_WAIT
            ):
                front.table.update(records, self.watch.drain, self.watch.newer())
                self._routed = True
            else:
                self.watch.seen = None  # look again next turn (the pass marks `passed`)

    async def _guard_port(self) -> None:
        """Name (once each) whoever joined the port since we bound it: ``SO_REUSEPORT``
        lets any process of our uid, and the kernel gives it a share of the connections,
        which no gateway can take back. Our own socket (by inode) is not looked into.

        On the loop itself while nothing is forwarded: a lookup (about a millisecond)
        handed to a worker thread woke that thread and the loop again, most of an idle
        gateway's wake-ups; a request forwarded meanwhile is not made to wait for it."""
        address, inodes = self._listening
        port = self.settings.port
        look = functools.partial(listener.strangers, self.state_dir, address, port, inodes)
        try:
            if self.gateway.metrics.inflight:
                found = await asyncio.get_running_loop().run_in_executor(None, look)
            else:
                found = look()
        except OSError:
            return
        for one in found:
            if one.who not in self._strangers:
                self._strangers.add(one.who)
                log.error(
                    "another listener shares the gateway's port and is given a share of "
                    "its connections: stop it",
                    address=f"{address}:{port}",
                    who=one.who,
                )

    def _retire_asked(self) -> None:
        asks = registry.retire_asks(self.state_dir)
        self._retiring &= {a.nonce for a in asks}  # a later ask for one is a new one
        for ask in asks:
            if ask.nonce not in self._retiring:
                self._retiring.add(ask.nonce)
                asyncio.get_running_loop().create_task(self._retire(ask))

    async def _retire(self, ask: registry.RetireAsk) -> None:
        front = self.gateway.front
        assert front is not None
        old = self.watch.record(ask.name)
        if old is not None and old.nonce == ask.nonce:
            new = self.watch.record(ask.new) if ask.new else None
            await front.table.retire(old, new, ask.grace)
        try:
            registry.ack_retire(self.state_dir, ask.nonce, self.nonce)
        except OSError as exc:
            log.error("drain not acknowledged", deployment=ask.name, error=str(exc))

    def _inherit(self) -> None:
        """The replaced gateways' final counters, each added to ours once it wrote them
        (``_hand_down``): the one we took over, and any replaced before it and still
        draining (two hand-overs in a row). A file is added by one gateway alone
        (``registry.claim_handed``): a replaced one that took its predecessor's before
        it handed down carries it in its own. One that died without writing them is
        counted from 0. Once none is awaited, what nobody will add is swept."""
        waiting = self._predecessors
        if waiting is None:
            return
        # Who is gone is looked at before the reads: a write just before its exit is seen.
        gone = {nonce for nonce, info in waiting.items() if not info.alive()}
        for nonce in list(waiting):
            if self._claim(nonce) or nonce in gone:
                del waiting[nonce]
        if not waiting:
            self._predecessors = None
            registry.sweep_handed(self.state_dir, self.nonce)

    def _claim(self, nonce: str) -> bool:
        """Gateway ``nonce``'s final counters added to ours if it left them and no other
        gateway took them first; True when it is done with (added, or unreadable)."""
        try:
            text = registry.claim_handed(self.state_dir, nonce)
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("old gateway's counters not read", nonce=nonce, error=str(exc))
            return True
        if text is None:
            return False
        try:
            self.gateway.metrics.inherit(text)
        except ValueError as exc:  # a torn or foreign file: counted from 0
            log.warning("old gateway's counters not read", nonce=nonce, error=str(exc))
        return True

    def _hand_down(self) -> None:
        """Replaced (another gateway is current): leave our final counters for it, so
        they run on there instead of starting from 0."""
        current = registry.read_current(self.state_dir)
        if current is None or current.nonce == self.nonce:
            return
        # Our predecessors' counters written by now are passed on in ours; one still
        # draining was live when our successor started: it waits for that one itself.
        self._inherit()
        path = registry.handed_path(self.state_dir, self.nonce)
        try:
            write_atomic(path, self.gateway.metrics_text().encode(), 0o600)
        except OSError as exc:
            log.warning("gateway counters not handed down", path=str(path), error=str(exc))

    async def _write_metrics(self, last: str) -> str | None:
        """The metrics text for the daemon's exporter, when it changed, else the file
        touched, so its mtime says when the text was last known current (the current
        gateway alone: a draining one leaves the file to its successor); the text in the
        file, None when it was not written. Rendered on a worker thread (the counters are
        read through snapshots, as the control socket's scrape does): prometheus-client's
        text of hundreds of series takes a while, which the requests on the loop must not
        wait for."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(None, self.gateway.metrics_text)
        current = registry.read_current(self.state_dir)
        ours = current is not None and current.nonce == self.nonce
        path = registry.metrics_path(self.state_dir)
        if text == last:
            if ours:  # its mtime: when a scrape's fallback was last current
                with contextlib.suppress(OSError):  # gone: the next change writes it
                    os.utime(path)
            return last
        if not ours:
            return None
        try:
            await loop.run_in_executor(None, write_atomic, path, text.encode(), 0o600)
        except OSError as exc:
            log.warning("gateway metrics not written", path=str(path), error=str(exc))
            return None
        return text

    # -- the main thread ---------------------------------------------------------------

    def _note(self, outcome: dict[str, str | None]) -> None:
        """A reload's refusals where `status` looks, and what it took cleared."""
        by = f"gateway pid {os.getpid()}"
        for subject, why in outcome.items():
            if why is None:
                refused.clear(self.state_dir, subject)
            else:
                refused.refuse(self.state_dir, subject, why, by, gateway=self.nonce)

    def _reload(self) -> None:
        """SIGHUP: the key file and TLS pair read again, the outcome noted, then counted
        answered (`reconcile gateway reload` waits for that: reloads.py)."""
        if self.reloads is not None:
            self.reloads.begin()
        self._note(self.gateway.reload())
        if self.reloads is not None:
            self.reloads.answer()

    def serve_until_stopped(self) -> None:
        """Signals are blocked in every thread (``main`` did it first): wait for them here."""
        while True:
            sig = signal.sigwait({*STOP_SIGNALS, signal.SIGHUP})
            if sig == signal.SIGHUP:
                self._reload()
                continue
            break
        # Handed over, it finishes what it holds, however long (DESIGN: an upgrade cuts
        # no stream); stopped, up to the drain grace. A SIGTERM meanwhile (`reconcile
        # gateway stop`) bounds a hand-over's drain too.
        grace = None if self._why == HANDED_OVER else self.settings.drain_grace
        log.info("gateway stopping", reason=self._why, grace=grace)
        if self.control is not None:
            self.control.close()
        self.gateway.stop_accepting()
        closing = self.gateway.begin_stop(self._why, grace)
        while closing is not None and not closing.done():
            if signal.sigtimedwait(STOP_SIGNALS, STOP_LOOK) is not None and grace is None:
                grace = self.settings.drain_grace
                log.info("gateway drain bounded", grace=grace)
                self.gateway.bound_drain(grace)
        self.gateway.end_stop()
        self._hand_down()  # after the last request: its count is in
        registry.unregister(self.state_dir, self.nonce)
        refused.clear(self.state_dir, refused.API_KEYS, refused.TLS_PAIR, gateway=self.nonce)
        self._wake.close()
        log.info("gateway stopped", pid=os.getpid())


def _say(fd: int | None, text: str) -> None:
    """Tell the starter how it went (``ready`` or the error); it may be gone (SIGKILLed)."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, text.encode()[:4000] + b"\n")
    with contextlib.suppress(OSError):
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controller.gateway")
    parser.add_argument("--settings", required=True, help="the gateway's settings as JSON")
    parser.add_argument("--nonce", required=True)
    parser.add_argument("--stop-wins", action="store_true", help="see keeper.start_process")
    args = parser.parse_args(argv)
    import json

    settings = settings_from_json(json.loads(args.settings))
    logsetup.configure(settings.verbosity)
    ready = os.environ.pop(registry.READY_FD, None)
    ready_fd = int(ready) if ready and ready.isdigit() else None
    # Before any thread starts (they inherit the mask): signals wait for sigwait().
    signal.pthread_sigmask(signal.SIG_BLOCK, {*STOP_SIGNALS, signal.SIGHUP})
    try:
        # The key file and the TLS pair are read here: a bad one is an error, not a trace.
        proc = GatewayProcess(settings, args.nonce)
        proc.open()
    except (ConfigError, OSError) as exc:
        where = f"{settings.host}:{settings.port}"
        message = str(exc) if isinstance(exc, ConfigError) else f"--listen {where}: {exc}"
        log.error("gateway did not start", error=message)
        _say(ready_fd, f"error: {message}")
        return 1
    # What start-up made (modules, settings, the app) lives as long as the process: kept
    # out of the collector's full passes, which walked it all every few thousand requests
    # (~14 ms each at 32 clients, a p99 outlier of their own). Collected first: start-up's
    # garbage is freed, not kept for good. Before "ready": its pause is start-up's.
    gc.collect()
    gc.freeze()
    _say(ready_fd, "ready")
    if args.stop_wins and registry.stop_asked(settings.state_dir):
        # Asked since our starter looked (under the start lock): `systemctl stop` cancels
        # a start under way. Registered first, so a stop whose look missed us (our
        # starter stopped, SIGSTOP: the stop did not wait for it) is answered here.
        proc.ask_stop(STOP_ASKED)
    proc.serve_until_stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
