"""Liveness probes of Ready engines, each answer handed to exactly one pass.

A hung engine (its process alive, every request stuck) is the case to catch, so no
probe may hold up a pass. The daemon's prober (``background=True``) runs each probe
on a worker thread when its period comes round (the daemon's timer calls
:meth:`LivenessProber.start_due`) and says when an answer is news (a failure, or a
success after failures), so the daemon runs a pass for it. ``--once``'s prober probes
each Ready engine once per pass and waits for the answers, concurrently, each bounded
by its ``timeoutSeconds``. Either way :meth:`take` gives each answer to one
observation, and the planner counts failures in a row in the record (no clock, no I/O).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from controller.core.state import Phase, ProbeResult, RecordView
from controller.host.probes import ProbeTarget, probe, probe_many
from controller.reconciler.probekeys import Keys, no_keys

News = Callable[[bool], None]  # called from a worker: True when a pass should count it


@dataclass
class _Slot:
    """One Ready engine (by nonce) the prober watches."""

    nonce: str
    target: ProbeTarget
    due: float  # monotonic: when the next probe starts
    failing: bool = False  # the record counts failures: a success is news too
    running: bool = False
    answers: list[ProbeResult] = field(default_factory=list)  # not yet taken by a pass


class LivenessProber:
    def __init__(
        self,
        *,
        background: bool = False,
        on_answer: News | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.background = background
        self.on_answer = on_answer
        self.clock = clock
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._closed = False  # the daemon is ending: no probe starts, no answer is news
        self._probed: set[str] = set()  # --once: probed in this pass (nonces)
        self.owner: str | None = None  # whose records it probes (another set's: not ours)

    def begin_pass(self, owner: str | None = None) -> None:
        """A new pass of ``owner``'s: ``--once``'s prober probes each Ready engine again."""
        self._probed.clear()
        self.owner = owner

    def take(
        self, views: Mapping[str, RecordView], keys: Keys = no_keys
    ) -> dict[str, tuple[ProbeResult, ...]]:
        """The answers no pass has counted yet, by record name (for this observation);
        ``keys``: the API key each engine's probes present (probekeys.py)."""
        with self._lock:
            self._watch(views, keys)
        if self.background:
            self.start_due()
        else:
            self._probe_now()
        with self._lock:
            out = {n: tuple(s.answers) for n, s in self._slots.items() if s.answers}
            for name in out:
                self._slots[name].answers.clear()
        return out

    def start_due(self) -> None:
        """Start every probe whose period came round (the daemon's timer; never waits)."""
        now = self.clock()
        with self._lock:
            due = [(n, s) for n, s in self._slots.items() if not s.running and s.due <= now]
            for _, slot in due:
                self._claim(slot, now)
        for name, slot in due:
            self._submit(name, slot)

    def _claim(self, slot: _Slot, now: float) -> None:
        slot.running = True
        slot.due = now + slot.target.config.period_seconds

    def _submit(self, name: str, slot: _Slot) -> None:
        """The probe on a daemon thread of its own (one per engine at most: its slot runs
        one at a time), never a pool's worker: an interpreter joins those as it exits, and
        a probe of a hung engine held the daemon's exit after its SIGTERM for the probe's
        whole timeout (up to an hour)."""
        if not self._closed:
            run = functools.partial(self._probe, name, slot)
            threading.Thread(target=run, name=f"liveness {name}", daemon=True).start()

    def next_due(self) -> float | None:
        """Seconds until the next probe starts (None: nothing to probe, or all running)."""
        with self._lock:
            waiting = [s.due for s in self._slots.values() if not s.running]
        return None if not waiting else max(min(waiting) - self.clock(), 0.0)

    def close(self) -> None:
        """No probe starts from now; one in flight ends unheard (its thread dies with us)."""
        self._closed = True

    # -- inside ---------------------------------------------------------------------

    def _watch(self, views: Mapping[str, RecordView], keys: Keys) -> None:
        """Slots for the Ready engines with a liveness probe; a new nonce starts afresh.
        A key once found for an engine is kept while it runs (it read its key at its
        start): a pass that finds none (its manifest not read: a git source's first fetch)
        takes none from it."""
        now = self.clock()
        wanted = {n: v for n, v in views.items() if _probed(v, self.owner)}
        for name in list(self._slots):
            view = wanted.get(name)
            if view is None or view.record.nonce != self._slots[name].nonce:
                del self._slots[name]  # an answer about an engine that is gone: dropped
        for name, view in wanted.items():
            rec = view.record
            assert rec.liveness is not None and rec.port is not None and rec.nonce is not None
            slot = self._slots.get(name)
            if slot is None:
                target = ProbeTarget(rec.host, rec.port, rec.liveness)
                slot = _Slot(rec.nonce, target, due=now + rec.liveness.period_seconds)
                self._slots[name] = slot
            key = keys(rec) or slot.target.bearer
            slot.target = ProbeTarget(rec.host, rec.port, rec.liveness, key)  # in-place update
            slot.failing = rec.liveness_failures > 0

    def _probe_now(self) -> None:
        with self._lock:
            todo = {n: s for n, s in self._slots.items() if s.nonce not in self._probed}
        answers = probe_many({n: s.target for n, s in todo.items()})
        with self._lock:
            for name, answer in answers.items():
                self._probed.add(todo[name].nonce)
                todo[name].answers.append(answer)

    def _probe(self, name: str, slot: _Slot) -> None:
        try:
            answer = probe(slot.target)
        except Exception as exc:  # a probe bug must not end the watch of the engine
            answer = ProbeResult(False, f"probe failed: {exc}")
        self._answered(name, slot, answer)

    def _answered(self, name: str, slot: _Slot, answer: ProbeResult) -> None:
        now = self.clock()
        with self._lock:
            slot.running = False
            current = self._slots.get(name) is slot
            news = current and (not answer.ready or slot.failing or _after_failure(slot))
            if current:
                _keep(slot, answer)
            again = current and slot.due <= now  # a probe that took its whole period
            if again:
                self._claim(slot, now)
        if again:  # next one now, from here: a pass in progress delays no probe
            self._submit(name, slot)
        if self.on_answer is not None and not self._closed:  # closed: its wake-up pipe too
            self.on_answer(news)


def _after_failure(slot: _Slot) -> bool:
    return bool(slot.answers) and not slot.answers[-1].ready


def _keep(slot: _Slot, answer: ProbeResult) -> None:
    """Every answer is kept for the next pass, a run of successes as its last one (so a
    daemon that passes rarely keeps little); a failure asks for a pass at once."""
    if answer.ready and slot.answers and slot.answers[-1].ready:
        slot.answers[-1] = answer
    else:
        slot.answers.append(answer)


def _probed(view: RecordView, owner: str | None) -> bool:
    rec = view.record
    return (
        view.alive
        and owner in (None, rec.owner)  # another manifest set's engines are its own to judge
        and rec.phase is Phase.READY
        and rec.liveness is not None
        and rec.port is not None
        and rec.nonce is not None
    )
