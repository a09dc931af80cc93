"""Passive health alone (gateway/routing/health.py), on a clock of its own: three failures in a
row eject an engine, nothing goes to it for the window, then one trial decides."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.gateway.routing.health import Health, Outcome, RotationChange


@dataclass(frozen=True)
class Engine:
    deployment: str = "web"
    instance: str = "web@1"
    nonce: str | None = "n1"


E = Engine()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def health() -> tuple[Health, Clock, list[RotationChange]]:
    clock, changes = Clock(), []
    return Health(window=30.0, clock=clock, notify=changes.append), clock, changes


def send(h: Health, outcome: Outcome) -> None:
    h.report(E, h.sent(E.nonce), outcome)


@pytest.mark.parametrize(
    ("outcomes", "ejected"),
    [
        pytest.param([500, 500, 500], True, id="three-5xx"),
        pytest.param(["refused", 502, "reset"], True, id="connection-failures-and-5xx"),
        pytest.param([500, 500, 200, 500, 500], False, id="a-success-resets-the-count"),
        pytest.param([500, 500, None, 500], True, id="no-verdict-keeps-the-count"),
        pytest.param([404, 429, 400, 499], False, id="4xx-is-the-client's"),
        pytest.param([503, 503], False, id="two-are-not-enough"),
        pytest.param([501, 505, 501, 501], False, id="501-505-are-about-the-request"),
        pytest.param([500, 501, 500, 500], False, id="a-501-answer-resets-the-count"),
    ],
)
def test_failures_in_a_row_eject(outcomes: list[Outcome], ejected: bool) -> None:
    h, _, changes = health()
    for outcome in outcomes:
        send(h, outcome)
    assert h.admits(E.nonce) is not ejected
    assert [c.ejected for c in changes] == ([True] if ejected else [])


def test_nothing_in_the_window_then_one_trial_whose_success_takes_it_back() -> None:
    h, clock, changes = health()
    for _ in range(3):
        send(h, 500)
    assert changes[0].ejected and "3 connection failures, timeouts or 5xx" in changes[0].reason
    assert "status 500" in changes[0].reason and changes[0].instance == "web@1"
    clock.now += 29.9
    assert not h.admits(E.nonce) and h.ejected([E.nonce]) == pytest.approx(0.1)
    clock.now += 0.1
    assert h.admits(E.nonce) and h.sent(E.nonce)  # the trial
    assert not h.admits(E.nonce) and not h.sent(E.nonce)  # one at a time
    h.report(E, True, 200)
    assert h.admits(E.nonce) and h.ejected([E.nonce]) is None
    assert [c.ejected for c in changes] == [True, False]


def test_a_failed_trial_ejects_again_and_stragglers_decide_nothing() -> None:
    h, clock, changes = health()
    straggler = h.sent(E.nonce)  # sent before the ejection, answers after it
    for _ in range(3):
        send(h, "ServerDisconnectedError")
    h.report(E, straggler, 200)  # not the trial: it stays ejected
    h.report(E, False, 500)
    assert not h.admits(E.nonce) and len(changes) == 1
    clock.now += 30
    trial = h.sent(E.nonce)
    h.report(E, trial, 503)
    assert not h.admits(E.nonce)
    assert [c.ejected for c in changes] == [True, True] and "trial" in changes[1].reason
    clock.now += 30
    h.report(E, h.sent(E.nonce), None)  # the client left: no verdict, the slot is free
    assert h.admits(E.nonce)
    send(h, 200)
    assert [c.ejected for c in changes] == [True, True, False]


def test_every_engine_must_be_ejected_for_a_pool_to_be_and_gone_ones_are_forgotten() -> None:
    h, _, _ = health()
    for _ in range(3):
        send(h, 500)
    assert h.ejected(["n1", "n2"]) is None  # n2 is fine
    assert h.ejected(["n1"]) == pytest.approx(30.0)
    h.forget({"n2"})
    assert h.admits("n1") and h.ejected(["n1"]) is None


def test_a_hung_verdict_ejects_at_once_and_an_ejected_engine_is_left_to_its_trial() -> None:
    h, clock, changes = health()
    send(h, 500)  # one failure before: the verdict needs no count
    h.hung(E, "no answer within 2s, nor to GET /health")
    assert not h.admits(E.nonce) and len(changes) == 1 and changes[0].ejected
    assert "no answer within 2s" in changes[0].reason
    h.hung(E, "again")  # its other requests' looks: ejected already, nothing more
    assert len(changes) == 1
    clock.now += 30.0
    trial = h.sent(E.nonce)
    h.hung(E, "the trial hangs too")  # the trial's own end decides, not this
    assert trial and len(changes) == 1
    h.report(E, trial, "the trial hangs too")
    assert len(changes) == 2 and not h.admits(E.nonce)


def test_answering_while_busy_is_known_of_an_engine_until_it_is_forgotten() -> None:
    """The hang watch's lesson (an engine that answers a look while busy) is the engine's
    own: not another's, and gone with its nonce (a restart is a new one)."""
    h, _, _ = health()
    assert not h.answers_busy("n1")
    h.answered_busy("n1")
    assert h.answers_busy("n1") and not h.answers_busy("n2")
    h.forget({"n1", "n2"})
    assert h.answers_busy("n1")
    h.forget({"n2"})
    assert not h.answers_busy("n1")
