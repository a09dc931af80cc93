"""Passive health: an instance that fails requests in a row is sent nothing for a while.

Three failures in a row from one engine (by nonce) eject it for 30 s, each a connection
failure, a 5xx answer other than 501 and 505 (``ABOUT_THE_REQUEST``), or a timeout (the
client gave up on an engine that then answered no GET either: ``Forwarder._judge_silence``):
the balancer skips it, so with replicas the requests go to the others. When the 30 s
are over, one request (the trial) may go to it while the others still skip
it: a good answer takes it back, a failure ejects it for another 30 s. Each change is
handed to ``notify`` (the gateway journals it and counts it in its metrics).

The counts live in plain dicts changed on the gateway's event loop: no lock, no disk
I/O, and a healthy engine's good answer costs one dict lookup. A request that ends
with no verdict (the client went away mid-answer, or before it from an engine that
still answers a GET) changes nothing but a trial's slot. Answers of
requests sent before an ejection (stragglers) change nothing either: only the trial
decides when an ejected engine comes back. Which engines answer a look while they
compute (``hangs.py`` learns it) is kept here too, so it is forgotten with the rest: when
the engine's nonce leaves the records (a restart is a new nonce) or moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

FAILURES = 3  # in a row
EJECT_SECONDS = 30.0
# 5xx answers about the request, not the engine: a method or HTTP version it does not
# implement. Counted as failures, three such requests from any client ejected a healthy
# engine and the gateway answered everyone 503 for 30 s (the fuzz soak found it).
ABOUT_THE_REQUEST = frozenset({501, 505})


@dataclass(frozen=True, slots=True)
class RotationChange:
    """An engine left the rotation (``ejected``) or came back into it."""

    deployment: str
    instance: str
    nonce: str | None
    ejected: bool
    reason: str


class Engine(Protocol):
    """What a report names (the routing table's ``Target``)."""

    @property
    def deployment(self) -> str: ...
    @property
    def instance(self) -> str: ...
    @property
    def nonce(self) -> str | None: ...


# How a request ended: the engine's status, a connection failure's text, or None (no
# verdict: the client went away).
Outcome = int | str | None


@dataclass(slots=True)
class _State:
    failures: int = 0  # in a row, while in the rotation
    until: float | None = None  # ejected until (monotonic); None: in the rotation
    trial: bool = False  # the one trial request is in flight
    last: str = ""  # what the last failure was


class Health:
    def __init__(
        self,
        *,
        failures: int = FAILURES,
        window: float = EJECT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        notify: Callable[[RotationChange], None] = lambda change: None,
    ) -> None:
        self.failures = failures
        self.window = window
        self.notify = notify
        self._clock = clock
        self._states: dict[str | None, _State] = {}  # only engines that failed lately
        # Engines seen answering a look while a request of theirs waited (hangs.py): only
        # these are judged hung by a look they leave unanswered.
        self._busy: set[str | None] = set()

    def admits(self, nonce: str | None) -> bool:
        """May a new request go to this engine now?"""
        state = self._states.get(nonce)
        if state is None or state.until is None:
            return True
        return not state.trial and self._clock() >= state.until

    def sent(self, nonce: str | None) -> bool:
        """A request goes to the engine now; True when it is the ejected engine's trial."""
        state = self._states.get(nonce)
        if state is None or state.until is None or state.trial:
            return False
        state.trial = True
        return True

    def report(self, engine: Engine, trial: bool, outcome: Outcome) -> None:
        """A request's end (``outcome``: see :data:`Outcome`); ``trial`` as :meth:`sent`
        said."""
        ok = None if outcome is None else _healthy(outcome)
        state = self._states.get(engine.nonce)
        if state is None:
            if ok is not False:
                return  # the common case: a healthy engine answered
            state = self._states[engine.nonce] = _State()
        if state.until is not None:
            if trial:
                self._trial_ended(engine, state, outcome)
            return  # a straggler sent before the ejection decides nothing
        if ok is None:
            return
        if ok:
            del self._states[engine.nonce]
            return
        state.failures += 1
        state.last = _said(outcome)
        if state.failures >= self.failures:
            why = f"{state.failures} connection failures, timeouts or 5xx answers in a row"
            self._eject(engine, state, why)

    def hung(self, engine: Engine, why: str) -> None:
        """The gateway's own look found the engine hung (``hangs.py``): ejected at once,
        no three in a row (each would cost a client its timeout). One ejected already
        is left to its trial's end."""
        state = self._states.setdefault(engine.nonce, _State())
        if state.until is not None:
            return
        state.last = why
        self._eject(engine, state, "it answered nothing, not even a look at it")

    def answers_busy(self, nonce: str | None) -> bool:
        """Was the engine seen answering a look while it held a request (``hangs.py``)?"""
        return nonce in self._busy

    def answered_busy(self, nonce: str | None) -> None:
        """The engine answered a look while it held a request: it answers while it
        computes, so a look it leaves unanswered means it is hung."""
        self._busy.add(nonce)

    def _trial_ended(self, engine: Engine, state: _State, outcome: Outcome) -> None:
        state.trial = False
        if outcome is None:
            return  # no verdict: the next request is the trial
        if _healthy(outcome):
            del self._states[engine.nonce]
            why = f"its trial request after the ejection succeeded ({outcome})"
            self.notify(
                RotationChange(engine.deployment, engine.instance, engine.nonce, False, why)
            )
            return
        state.last = _said(outcome)
        self._eject(engine, state, "its trial request failed")

    def _eject(self, engine: Engine, state: _State, why: str) -> None:
        state.until = self._clock() + self.window
        state.failures = 0
        reason = f"{why} (last: {state.last}): no new requests for {self.window:g}s, then one trial"
        self.notify(RotationChange(engine.deployment, engine.instance, engine.nonce, True, reason))

    def ejected(self, nonces: Iterable[str | None]) -> float | None:
        """Seconds until the first of these ejected engines may take its trial (0: one
        may now, or has its trial in flight); None when one of them is in the rotation."""
        waits: list[float] = []
        now = self._clock()
        for nonce in nonces:
            state = self._states.get(nonce)
            if state is None or state.until is None:
                return None
            waits.append(max(0.0, state.until - now))
        return min(waits) if waits else None

    def forget(self, live: set[str | None]) -> None:
        """Drop what is known of engines no record names any more."""
        for gone in [n for n in self._states if n not in live]:
            del self._states[gone]
        self._busy &= live


def _healthy(outcome: int | str) -> bool:
    """An answer that says the engine works: below 500, or a 5xx about the request."""
    return isinstance(outcome, int) and (outcome < 500 or outcome in ABOUT_THE_REQUEST)


def _said(outcome: Outcome) -> str:
    return f"status {outcome}" if isinstance(outcome, int) else str(outcome)
