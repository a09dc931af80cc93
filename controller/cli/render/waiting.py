"""`--once --wait`: keep passing until every deployment is Ready, stuck, or out of time.

On a terminal the progress of each deployment (phase, elapsed against its readiness
deadline, the probe's last answer, the back-off, or a pull's bar) is redrawn in place
below the log lines, like ``docker compose up``; anywhere else each change is one log
line, and a pull one line per tenth of its bytes (a 40 GB pull is ten lines, not one a
pass).
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from controller.cli.render import pullshow
from controller.core import imagepulls
from controller.core.actions import Restart
from controller.core.manifest.names import base_name
from controller.core.manifest.quantity import format_age
from controller.core.plan import waits_turn
from controller.core.pulls import progress_text
from controller.core.state import STUCK, MarkedProcess, Phase, Record, backoff_cause
from controller.logsetup import apply as apply_log_setup
from controller.logsetup import get_logger, structlog_module, terminal
from controller.reconciler import pulling
from controller.reconciler.run import PassResult, Reconciler, exec_text
from controller.reconciler.strays import named_by
from controller.redact import printable
from controller.store.instances.records import RecordProblem

log = get_logger("reconcile")

# Nothing more happens without the user (Idle: an OnDemand deployment until a request).
SETTLED = (Phase.READY, Phase.SUCCEEDED, Phase.IDLE, *STUCK)
TICK = 0.25  # seconds between redraws on a terminal
# Restarts a deployment may add during one wait before it counts as crash-looping: the
# back-off would go on for good, so the wait ends (exit 1) with its last exit instead.
CRASH_BOUND = 2
INTERRUPTED = (
    "reconcile: interrupted: the wait stopped, the engines keep running (they outlive a "
    "pass); `reconcile status` shows them, `reconcile down` stops them"
)


def wait_until_ready(reconciler: Reconciler, timeout: float, stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    # TERM=dumb (an editor's shell, a CI log) cannot move the cursor: log lines there.
    state_dir = reconciler.config.state_dir
    display: Display = Live(stream, state_dir) if terminal(stream).fancy else Lines(state_dir)
    try:
        with _CtrlC() as ctrl_c:
            return _loop(reconciler, timeout, display, ctrl_c)
    except KeyboardInterrupt:  # Ctrl-C ends the wait, not the engines: say so, and what next
        display.close()
        print(INTERRUPTED, file=sys.stderr)
        raise
    finally:
        display.close()


class _CtrlC:
    """Ctrl-C, remembered as well as raised. Python drops a KeyboardInterrupt raised inside
    a callback it runs for itself (importlib's module-lock weakref callback during a lazy
    import, a ``__del__``): "Exception ignored in ...", and the wait went on for good (CI
    saw it). The loop looks at :attr:`pressed` between steps and raises it again there;
    such a dropped interrupt is not printed (it is not lost: the loop honours it)."""

    def __init__(self) -> None:
        self.pressed = False
        self._handler: Any = None
        self._hook = sys.unraisablehook

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._handler = signal.signal(signal.SIGINT, self._on_sigint)
            sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handler is not None:
            signal.signal(signal.SIGINT, self._handler)
            sys.unraisablehook = self._hook

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def _unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._hook(unraisable)

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt


def _loop(reconciler: Reconciler, timeout: float, display: Display, ctrl_c: _CtrlC) -> bool:
    deadline = time.monotonic() + timeout
    aside = SetAside()
    restarts: dict[str, int] = {}  # each deployment's restarts before the wait's passes
    retried: set[str] = set()  # engines kept whose new image's pull this wait saw retried
    while True:
        result = reconciler.run_pass()
        ctrl_c.check()
        display.update(result)
        aside.note(result)
        quarantined = aside.left(result)
        if result.all_ready and not quarantined:
            # Ready is not in sync when a folder is missing or empty (nothing pruned) or
            # the git fetch failed: `--once` exits 1 on those, and so does the wait (it
            # said nothing and exited 0: a quick start run from the wrong folder "worked").
            failing = result.failing()
            _close(display, aside, result)
            for why in failing:
                print(f"error: {printable(why)}", file=sys.stderr)
            return not failing
        # A crash loop, an image no retry can pull, a pull failing again and again, or a
        # program its start could not exec goes on by itself for good.
        looping = _looping(result, restarts)
        looping |= _pull_failed(result, restarts)
        looping |= _kept_for_good(result, retried)
        looping |= pulling.failing(result.ours(), result.pulls, result.sources)
        looping |= {r.name: exec_text(r) for r in result.ours() if r.exec_failed}
        stuck = "; ".join([*filter(None, [_stuck(result, quarantined)]), *looping.values()])
        stuck = printable(stuck)  # engines' words: shown in a terminal, never acted on
        # What needs the user (a broken manifest, no capacity) ends the wait only once
        # everything else has got as far as it can: the valid deployments beside a broken
        # file still come up, then the exit status says what is broken.
        if stuck and not _progressing(result, set(looping)):
            _close(display, aside, result)
            print(f"reconcile: cannot progress without you: {stuck}", file=sys.stderr)
            return False
        if time.monotonic() >= deadline:
            _close(display, aside, result)
            print(_timed_out(result, timeout), file=sys.stderr)
            if stuck:
                print(
                    f"reconcile: cannot progress without you: {printable(stuck)}", file=sys.stderr
                )
            return False
        next_pass = time.monotonic() + min(_period(result), max(deadline - time.monotonic(), 0))
        while time.monotonic() < next_pass:
            time.sleep(min(TICK, max(next_pass - time.monotonic(), 0)))
            ctrl_c.check()
            display.tick()


def _close(display: Display, aside: SetAside, result: PassResult) -> None:
    """The wait's end: what its passes set aside, and this node's share of a fleet, said
    as ``--once`` says it (a wait that left deployments to other nodes said nothing)."""
    display.close()
    aside.say(result)
    for note in result.fleet_notes():
        print(note)


class SetAside:
    """The records this wait's passes quarantined, and the engines they adopted. Each is
    reported by the one pass that moved it aside, so the wait remembers it: one whose
    deployment this set's records account for again (its engine adopted, or started
    anew) is what happened, said once the wait ends; any other is left to the user."""

    def __init__(self) -> None:
        self.problems: dict[str, RecordProblem] = {}  # message -> the record's problem
        self.adopted: dict[str, MarkedProcess] = {}  # name -> its engine

    def note(self, result: PassResult) -> None:
        self.problems.update((p.message, p) for p in result.problems)
        self.adopted.update(result.adopted)

    def left(self, result: PassResult) -> list[str]:
        """What still needs the user: a record of an unknown version (left in place), one
        quarantined that no record of this set's stands for now."""
        ours = {r.name for r in result.ours()}
        return [m for m, p in self.problems.items() if p.kept or p.name not in ours]

    def say(self, result: PassResult) -> None:
        """What became of each record accounted for again: quarantined, its engine adopted."""
        left = set(self.left(result))
        for message, problem in self.problems.items():
            if message in left:
                continue
            adopted = self.adopted.get(problem.name or "")
            engine = (f"; its engine (pid {adopted.ref.pid}) adopted, as {named_by(adopted)} "
                      "names it" if adopted else "")  # fmt: skip
            print(f"reconcile: {problem.name}: {printable(message)}{engine}", file=sys.stderr)


def _timed_out(result: PassResult, timeout: float) -> str:
    """The wait's limit passed: what it waited for, where each stands, and the next move
    (it said only `timed out waiting for slow`: nothing of its phase, or what to do)."""
    return (
        f"reconcile: timed out waiting for {_waited(result)} after {format_age(timeout)} "
        "(--timeout): the engines go on (they outlive a pass); `reconcile status` shows "
        "where they stand, `reconcile logs NAME` why, and a longer --timeout waits longer"
    )


def _waited(result: PassResult) -> str:
    """What the wait timed out on: instances not Ready yet (and their phase), and those
    Ready on their old spec while the new one gets ready beside them (a rolling update's
    pull: no record)."""
    out = []
    for rec in result.ours():
        if rec.phase not in (Phase.READY, Phase.IDLE):
            said = f": {printable(rec.message)}" if rec.message else ""  # a back-off's why
            out.append(f"{rec.name} ({rec.phase}{said})")
        elif result.specs.get(base_name(rec.name), rec.spec_hash) != rec.spec_hash:
            out.append(f"{rec.name} (its new spec)")
    return ", ".join(out)


def _progressing(result: PassResult, looping: set[str]) -> bool:
    """Some deployment of ours is on its way (starting, backing off, stopping, Pending for
    its turn on a shared device: the next pass starts it) by itself; one crash-looping
    past the bound is going nowhere."""
    return any(
        (r.phase not in SETTLED or waits_turn(r)) and not {r.name, base_name(r.name)} & looping
        for r in result.ours()
    )


def _stuck(result: PassResult, quarantined: list[str]) -> str:
    """What cannot progress without the user: bad manifests and records, stuck phases
    (those ``--once`` exits 1 on: a start waiting its turn on a device is not one; the
    wait ended on one whose turn came, in the very pass whose probe saw the other Ready)."""
    reasons = [str(e) for e in result.errors] + quarantined
    reasons += [f"{r.name} {r.phase}: {r.message}" for r in result.stuck()]
    reasons += result.held_changes()  # Ready on its old spec until uncordon
    return "; ".join(reasons)


def _looping(result: PassResult, restarts: dict[str, int]) -> dict[str, str]:
    """Deployments whose restarts rose past CRASH_BOUND during this wait: name -> why.
    The restarts of the pass that first shows a deployment are the wait's own (a new
    engine's immediate restart): they count, as the back-off's later ones do."""
    out = {}
    for rec in result.ours():
        made = sum(1 for a in result.actions if isinstance(a, Restart) and a.name == rec.name)
        first = restarts.setdefault(rec.name, max(rec.restarts - made, 0))
        if rec.phase is Phase.BACKOFF and rec.restarts - first >= CRASH_BOUND:
            why = str(rec.last_exit) if rec.last_exit else backoff_cause(rec.message)
            out[rec.name] = f"{rec.name} keeps failing ({rec.restarts} restarts; last: {why})"
    return out


def _pull_failed(result: PassResult, restarts: dict[str, int]) -> dict[str, str]:
    """Deployments backing off from an image pull the wait need not retry: name -> why.
    No such image, no access: at once (a retry asks the same registry the same thing);
    any other failure (a registry down) once the back-off's retry failed too, so a
    registry that was back in a moment costs one back-off, not the timeout."""
    out = {}
    for rec in result.ours():
        if rec.phase is not Phase.BACKOFF or not imagepulls.failed(rec.message):
            continue
        retried = rec.restarts > restarts.get(rec.name, rec.restarts)
        if retried or imagepulls.final(rec.message):
            out[rec.name] = f"{rec.name}: {backoff_cause(rec.message)}"
    return out


def _kept_for_good(result: PassResult, retried: set[str]) -> dict[str, str]:
    """Engines kept serving because their new spec's image did not pull: name -> why, as
    ``_pull_failed`` judges a start's (at once where no retry fixes it or Never forbids a
    pull, else once the retry failed too). The wait sat out its timeout on them: their
    record is Ready on the old spec, with no back-off to read."""
    out = {}
    for name, why in result.held.items():
        if why.endswith(imagepulls.RETRYING):
            retried.add(name)
        elif imagepulls.kept_for_good(why, name in retried):
            out[name] = f"{name}: {why}"
    return out


def _period(result: PassResult) -> float:
    periods = [r.probe.period_seconds for r in result.ours() if r.phase is Phase.STARTING]
    return max(0.2, min(periods, default=1.0))


# -- what one deployment is doing ------------------------------------------------------------


def progress(rec: Record, probe: str | None, now: datetime, state_dir: Path) -> str:
    """``Starting  12s/600s  GET /health -> 503``, a pull's bar, and the like."""
    if rec.phase is Phase.PULLING and not rec.message.startswith("pull failed"):
        pulled = pullshow.progress_of(rec, state_dir)
        if pulled is not None:
            return pullshow.bar(pulled)
    if rec.phase is Phase.STARTING and rec.started_at:
        elapsed = format_age((now - rec.started_at).total_seconds())
        limit = "?"
        if rec.ready_deadline_at:
            limit = format_age((rec.ready_deadline_at - rec.started_at).total_seconds())
        answer = f"  last probe: {probe}" if probe else "  waiting for the first probe"
        return f"{elapsed}/{limit}{answer}"
    if rec.phase is Phase.BACKOFF and rec.backoff_until:
        left = max((rec.backoff_until - now).total_seconds(), 0)
        ended = rec.last_exit if not rec.exec_failed else None  # its words say more than 127
        why = str(ended) if ended else backoff_cause(rec.message)
        return f"restart in {format_age(left)}" + (f"  ({why})" if why else "")
    if rec.phase is Phase.READY and rec.ready_at and rec.started_at:
        return f"ready after {(rec.ready_at - rec.started_at).total_seconds():.1f}s"
    return rec.message


class Display:
    def update(self, result: PassResult) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        """Between passes: a terminal redraws the clocks; a log has nothing new to say."""

    def close(self) -> None:
        """Leave the last state on screen."""


class Lines(Display):
    """Off a terminal: one log line per change of phase, message or probe answer; a pull
    one per tenth of its bytes (its message, a live figure, changes every pass)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.shown: dict[str, tuple[str, str, str]] = {}

    def update(self, result: PassResult) -> None:
        for rec in sorted(result.ours(), key=lambda r: r.name):
            probe = result.probes.get(rec.name, "") if rec.phase is Phase.STARTING else ""
            message, news = self._pull_line(rec) or (rec.message, rec.message)
            key = (str(rec.phase), news, probe)
            if self.shown.get(rec.name) != key:
                self.shown[rec.name] = key
                fields = {"phase": str(rec.phase), "message": message or None}
                if probe:
                    fields["probe"] = probe
                log.info("progress", deployment=rec.name, **fields)

    def _pull_line(self, rec: Record) -> tuple[str, str] | None:
        """A running pull's (message, what makes it news): its tenth of the bytes."""
        if rec.message.startswith("pull failed"):
            return None
        pulled = pullshow.progress_of(rec, self.state_dir)
        if pulled is None:
            return None
        tenth = pullshow.decile(pulled)
        return progress_text(pulled), "pull" if tenth is None else f"pull {tenth}/10"


class Live(Display):
    """On a terminal: a block of one line per deployment, redrawn in place.

    Log lines written meanwhile (structlog prints to this object) go above it.
    """

    def __init__(self, stream: TextIO, state_dir: Path) -> None:
        self.stream = stream
        self.state_dir = state_dir
        self.height = 0
        self.result: PassResult | None = None
        self.closed = False
        self.partial = ""
        structlog = structlog_module()  # not at the top: `--wait -q` off a terminal never logs

        apply_log_setup()  # the CLI's set-up first (it waits for a first log line), ours on top
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=self))

    # structlog's PrintLogger prints here: whole lines go above the block
    def write(self, text: str) -> int:
        if self.closed:
            return self.stream.write(text)
        self.partial += text
        if "\n" in self.partial:
            done, _, self.partial = self.partial.rpartition("\n")
            self._clear()
            self.stream.write(done + "\n")
            self._draw()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def update(self, result: PassResult) -> None:
        self.result = result
        self.tick()

    def tick(self) -> None:
        if not self.closed:
            self._clear()
            self._draw()

    def close(self) -> None:
        if not self.closed:
            self.tick()
            self.closed = True
            structlog = structlog_module()
            structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=self.stream))

    def _lines(self) -> list[str]:
        if self.result is None:
            return []
        now = datetime.now(UTC)
        recs = sorted(self.result.ours(), key=lambda r: r.name)
        width = max((len(r.name) for r in recs), default=0)
        cols = shutil.get_terminal_size((100, 24)).columns
        out = []
        for rec in recs:
            mark = "✔" if rec.phase is Phase.READY else ("✘" if rec.phase in STUCK else "…")
            detail = progress(rec, self.result.probes.get(rec.name), now, self.state_dir)
            line = f"{mark} {rec.name:<{width}}  {rec.phase!s:<11} {printable(detail)}"
            out.append(line[: cols - 1])
        return out

    def _clear(self) -> None:
        if self.height:
            self.stream.write(f"\x1b[{self.height}F\x1b[J")  # up to the block's start, erase
            self.height = 0

    def _draw(self) -> None:
        lines = self._lines()
        for line in lines:
            self.stream.write(line + "\n")
        self.height = len(lines)
        self.stream.flush()
